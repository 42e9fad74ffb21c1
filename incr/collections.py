"""Incremental collections: keyed maps whose operators propagate one key at a time.

``input_map(rt, name, mapping)`` declares a keyed input; its operators (``map``, ``filter``,
``map_keys``, ``join``, ``group_by``) return incremental maps and its folds (``sum``,
``count``, ``min``, ``max``, ``top_k``, ``reduce``, ``fold``) return cell-like values. Every map
and fold is an incr cell with no arguments (``rt.observe(total)``, ``rt.explain(total)``,
``total()`` inside a cell), so early cutoff, observers and explanations work as for any cell.

How it propagates (read this before changing anything here):

- every map node keeps its current content (``_data``) and a log of the keys whose entry
  changed (``_log``, absolute positions from ``_log_start``); its cell's value is a ``MapView``
  that compares equal exactly when the log did not move, so a run that changed no key cuts off;
- a node's cell reads its upstream cells (engine dependencies), takes the keys logged since the
  position it last consumed (``_seen``) into ``_pending``, and recomputes those keys only; a
  consumer that fell behind a trimmed log re-reads everything (O(n), amortized by the trim);
- ``map(cell)`` demands one instance ``cell(key, value)`` per key, untracked: the map does not
  depend on every instance (that would make each run O(n)); it reads, tracked, whatever those
  instances read besides their arguments (``_ext``), and re-demands only the keys whose
  instance read a dependency that changed. A plain function is called directly; anything it
  reads makes a change there re-run it for every key;
- folds keep a ``FoldTree`` (incr._collections, compiled): one key changed is one root path;
  ``sum`` over int values keeps a running total instead (``SumFold``: O(1) per changed key,
  moving to a tree at the first value that is not an int).

Collection cells are never written to the store (their state lives in this process and is
rebuilt at the first demand); the ``map`` instances they demand are ordinary cells and are
stored and reused across processes like any other. On a runtime with a store, ``map`` of a
plain function maps a cell of that function (``_stored_as_cell``: the identity a cell of it
would have), so its per-key results are stored too; without a store it is called directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

from incr._collections import (_ABSENT, _KINDS, MODE_FILTER, MODE_HOOKS, MODE_INPUT, MODE_MAP,
                               FoldBase, FoldTree, InputMapBase, MapBase, MapView, MinMaxFold,
                               NodeBase, PerKeyFn, Stamp, SumFold, _key_kind,
                               _check_shapes, _refuse_foreign)
from incr._core import Cell, Input, current
from incr._core import _refuse_coroutine_function as _refuse_async_fn
from incr.keys import register_type

__all__ = ["IncrMap", "InputMap", "Fold", "Group", "MapView", "input_map"]

_Node = NodeBase
_EMPTY_KIND = object()
_PerKeyFn = PerKeyFn

def _pairs(mapping: Any, where: str) -> dict:
    """``dict(mapping)`` for a mapping or an iterable of (key, value) pairs; anything else is a
    TypeError naming ``where`` (checked before anything changes)."""
    if type(mapping) is dict:
        return mapping.copy()    # (the same dict: a table copy, not a walk over its items)
    try:
        return dict(mapping.items() if hasattr(mapping, "items") else mapping)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{where}: needs a mapping or an iterable of (key, value) pairs, got "
                        f"{type(mapping).__name__} {mapping!r:.60} ({e})") from None


def _stored_as_cell(fn: Any) -> Any:
    """The cell that stands for the plain function ``fn`` in a ``map`` on a runtime with a
    store: its per-key results are stored and reused across processes like a cell's, under
    the identity a cell of ``fn`` would have (``module.qualname`` and a hash of its code and
    closure: incr.keys.cell_identity, docs/store.md). One cell per function object, kept on
    the function (so its identity is computed once, as for a decorated function); a callable
    that takes no attribute gets a new cell per ``map``. ``fn`` itself if it cannot be a cell.
    """
    c = getattr(fn, "_incr_map_cell", None)
    if isinstance(c, Cell) and c.fn is fn:
        return c
    try:
        c = Cell(fn)
    except Exception:       # (a callable incr.cell refuses: called directly, not stored)
        return fn
    try:
        fn._incr_map_cell = c
    except (AttributeError, TypeError):
        pass
    return c


def _refuse_key(m: Any, key: Any, what: str) -> None:
    """A read of ``key`` raised TypeError: if ``key`` is not a key at all (unhashable, a list),
    raise a TypeError naming the map and the method instead; else return (the caller re-raises
    the original error)."""
    where = f"input_map {m.label!r}: {what}" if isinstance(m, InputMap) else f"{m.label}: {what}"
    _key_kind(key, where)


def _fn_label(fn: Any) -> str:
    q = getattr(fn, "qualname_label", None) or getattr(fn, "__qualname__", None) \
        or getattr(fn, "__name__", None) or repr(fn)
    return q.rsplit("<locals>.", 1)[-1]


class Group(Mapping):
    """The value of one group of ``group_by``: a read-only mapping of the group's entries, in
    key order.

    Like a ``MapView`` it reads the group as it is now (as of its last stabilization or
    demand), not a copy taken when it was made: a change to one entry costs O(1), not a new
    dict of the whole group. Two groups of the same ``group_by`` are equal when they are the
    same group at the same change; against any other mapping (a dict), equality compares the
    entries. ``dict(group)`` or ``copy.copy(group)`` takes a snapshot (a dict).

    As a cell's argument (``groups.map(cell)``) a group is keyed by its entries as
    ``(key, value)`` pairs in key order, whatever the kind of its keys (ints, tuples: a dict
    with such keys could not be stored), and the cell gets a *detached* Group: the same
    entries, read-only, in key order, no longer following the map (``_node`` is None). That
    is also what a stored argument decodes to.
    """

    __slots__ = ("_node", "_g", "_members", "_version")

    def __init__(self, node: Any, g: Any, members: dict, version: int) -> None:
        self._node = node
        self._g = g
        self._members = members
        self._version = version

    def __getitem__(self, key: Any) -> Any:
        return self._members[key]

    def __iter__(self):  # type: ignore[no-untyped-def]
        node = self._node
        if node is None:                    # detached: its members are in key order
            return iter(self._members)
        return iter(node._group_keys(self._g, self._members))

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, key: object) -> bool:
        return key in self._members

    def __eq__(self, other: object) -> bool:
        if type(other) is Group and self._node is not None and other._node is self._node \
                and type(other._g) is type(self._g) and other._g == self._g:  # type: ignore[attr-defined]
            return other._version == self._version  # type: ignore[attr-defined]
        if isinstance(other, Mapping):
            return len(self) == len(other) and dict(self.items()) == dict(other.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __copy__(self) -> dict:
        return dict(self.items())

    def __deepcopy__(self, memo: Any) -> dict:
        import copy
        return copy.deepcopy(dict(self.items()), memo)

    def __repr__(self) -> str:
        return f"Group({dict(self.items())!r})"


def _encode_group(g: Group) -> tuple:
    # its entries as (key, value) pairs in key order: any key kind encodes (a dict with int or
    # tuple keys would not), and equal groups are one instance
    return tuple(g.items())


def _decode_group(t: Any) -> Group:
    """A detached Group of the pairs ``t`` (in key order, as encoded): what a cell taking a
    group gets, as its kept copy, each run's copy, or an argument read back from the store.
    Anything but a sequence of 2-tuples is refused (a damaged record is a miss)."""
    if type(t) is not tuple:
        raise TypeError(f"a Group is encoded as a tuple of (key, value) pairs, got {type(t).__name__}")
    members: dict = {}
    for pair in t:
        if type(pair) is not tuple or len(pair) != 2:
            raise TypeError(f"a Group entry is a (key, value) pair, got {pair!r:.60}")
        members[pair[0]] = pair[1]
    return Group(None, None, members, 0)


register_type(Group, _encode_group, _decode_group)


class IncrMap(MapBase):
    """An incremental map: a cell whose value is a ``MapView`` of its entries.

    Read it with ``m()`` (a MapView), ``m[key]``, ``m.get(key)``, ``m.items()``, ``len(m)``,
    iteration (key order); inside a running cell these record a dependency on the map.
    Transform it with ``map``, ``filter``, ``map_keys``, ``join``, ``group_by``; fold it with
    ``sum``, ``count``, ``min``, ``max``, ``top_k``, ``reduce``, ``fold``.
    """

    __slots__ = ()   # (its fields are MapBase's, compiled)

    @property
    def last_changes(self) -> list:
        """The keys whose entry changed in the node's last run (while the log still holds
        them), for tests and explanations."""
        return list(self._since(self._ran_from) or ())

    # -- reading -------------------------------------------------------------------------------

    def __getitem__(self, key: Any) -> Any:
        self._demand()
        try:
            return self._data[key]
        except TypeError:                       # unhashable: say which map and which key
            _refuse_key(self, key, "[]")
            raise

    def get(self, key: Any, default: Any = None) -> Any:
        self._demand()
        try:
            return self._data.get(key, default)
        except TypeError:
            _refuse_key(self, key, "get")
            raise

    def __contains__(self, key: object) -> bool:
        self._demand()
        try:
            return key in self._data
        except TypeError:
            _refuse_key(self, key, "in")
            raise

    def __len__(self) -> int:
        self._demand()
        return len(self._data)

    def __iter__(self):  # type: ignore[no-untyped-def]
        self._demand()
        return iter(list(self._sorted_keys()))

    def keys(self) -> list:
        self._demand()
        return list(self._sorted_keys())

    def items(self) -> list:
        self._demand()
        d = self._data
        return [(k, d[k]) for k in self._sorted_keys()]

    def values(self) -> list:
        self._demand()
        d = self._data
        return [d[k] for k in self._sorted_keys()]

    def to_dict(self) -> dict:
        """A plain dict of the entries, in key order."""
        return dict(self.items())

    # -- operators -------------------------------------------------------------------------

    def map(self, fn: Callable[[Any, Any], Any]) -> IncrMap:
        """``{key: fn(key, value)}``: one computation per key. With an incr cell (or an
        ``@incr.llm`` node), one instance ``fn(key, value)`` per key; a changed key demands its
        own instance only, a deleted key drops its entry."""
        if not isinstance(fn, Cell):
            # a plain function is called from sync code (an async one: @incr.cell async def)
            _refuse_async_fn(fn, f"{self.label}.map: fn (make it an @incr.cell async def)")
            if self._rt.store_path is not None:
                fn = _stored_as_cell(fn)
        return _MapNode(self, fn)

    def filter(self, pred: Callable[[Any, Any], Any]) -> IncrMap:
        """The entries for which ``pred(key, value)`` is true."""
        _refuse_async_fn(pred, f"{self.label}.filter: pred")
        return _FilterNode(self, pred)

    def map_keys(self, fn: Callable[[Any], Any]) -> IncrMap:
        """``{fn(key): value}``; ``fn`` must not map two present keys to one (ValueError)."""
        _refuse_async_fn(fn, f"{self.label}.map_keys: fn")
        return _MapKeysNode(self, fn)

    def join(self, other: IncrMap, how: str = "inner") -> IncrMap:
        """``{key: (left, right)}`` for the keys of both maps (``how="inner"``), of this one
        (``"left"``, a missing right is None) or of either (``"outer"``)."""
        return _JoinNode(self, other, how)

    def group_by(self, fn: Callable[[Any, Any], Any]) -> IncrMap:
        """``{group: Group}`` with ``group = fn(key, value)``: each ``Group`` is a read-only
        mapping of that group's entries in key order, kept up to date in O(1) per changed
        key (it reads the group as it is now; ``dict(group)`` takes a snapshot)."""
        _refuse_async_fn(fn, f"{self.label}.group_by: fn")
        return _GroupByNode(self, fn)

    def sum(self, start: Any = 0) -> Fold:
        """The sum of the values (``start`` when empty), in key order."""
        return Fold(self, "sum", f"{self.label}.sum", identity=start)

    def count(self) -> Fold:
        """The number of entries."""
        return Fold(self, "count", f"{self.label}.count")

    def min(self, default: Any = None) -> Fold:
        """The least value, or ``default`` when empty."""
        return Fold(self, "min", f"{self.label}.min", identity=default)

    def max(self, default: Any = None) -> Fold:
        """The greatest value, or ``default`` when empty."""
        return Fold(self, "max", f"{self.label}.max", identity=default)

    def top_k(self, k: int, key: Callable[[Any], Any] | None = None) -> Fold:
        """The ``k`` entries with the largest values (or ``key(value)``), as a tuple of
        ``(key, value)`` pairs, largest first; equal values in key order (as
        ``heapq.nlargest(k, m.items(), key=...)``)."""
        if type(k) is bool or not isinstance(k, int):
            raise TypeError(f"{self.label}.top_k: k must be an int >= 0, got "
                            f"{type(k).__name__} {k!r:.60}")
        if k < 0:
            raise ValueError(f"{self.label}.top_k: k must be an int >= 0, got {k!r}")
        if key is not None:
            if not callable(key):
                raise TypeError(f"{self.label}.top_k: key must be a function of the value or "
                                f"None, got {type(key).__name__} {key!r:.60}")
            _refuse_async_fn(key, f"{self.label}.top_k: key")
        label = f"{self.label}.top_k({k}" + (f", key={_fn_label(key)})" if key else ")")
        return Fold(self, "top_k", label, k=k, keyfn=key)

    def reduce(self, op: Callable[[Any, Any], Any], identity: Any = None) -> Fold:
        """``op`` over the values in key order (``identity`` when empty); ``op`` must be
        associative. Kept in a balanced tree: one changed key costs O(log n) calls of op."""
        if not callable(op):
            raise TypeError(f"reduce: op must be callable, got {op!r}")
        _refuse_async_fn(op, f"{self.label}.reduce: op")
        return Fold(self, "reduce", f"{self.label}.reduce({_fn_label(op)})", op=op,
                    identity=identity)

    def fold(self, add: Callable[[Any, Any, Any], Any], remove: Callable[[Any, Any, Any], Any],
             init: Any) -> Fold:
        """An accumulator: ``add(acc, key, value)`` for each entry that appears,
        ``remove(acc, key, value)`` for each that goes (a changed entry is removed, then added
        again). O(1) calls per changed key; ``remove`` must undo ``add``."""
        if not (callable(add) and callable(remove)):
            raise TypeError("fold: add and remove must be callable")
        _refuse_async_fn(add, f"{self.label}.fold: add")
        _refuse_async_fn(remove, f"{self.label}.fold: remove")
        return Fold(self, "fold", f"{self.label}.fold({_fn_label(add)}, {_fn_label(remove)})",
                    add=add, remove=remove, identity=init)


class InputMap(IncrMap, InputMapBase):
    """A keyed input. Create with ``incr.input_map(rt, name, mapping)``.

    ``set(key, value)``, ``delete(key)`` and ``update(mapping, delete=())`` (one revision)
    change it outside computations; ``get``, ``m[key]``, ``len``, iteration (key order) read
    it. Inside a running cell ``m[key]`` and ``m.get(key)`` depend on that key only.
    """

    __slots__ = ()

    def __init__(self, rt: Any, name: str, mapping: Any = None) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"input_map needs a non-empty str name, got {name!r}")
        data = None
        if mapping is not None:
            # checked before the name is taken: a bad mapping or key leaves nothing declared
            data = _pairs(mapping, f"input_map {name!r}")
            kinds = {type(k) for k in data}
            simple = len(kinds) == 1 and _KINDS.get(next(iter(kinds))) not in (None, "tuple")
            if simple and float in kinds and any(k != k for k in data):
                simple = False      # a NaN key: refused below, naming it
            if not simple:
                first = _EMPTY_KIND
                for k in data:
                    kind = _key_kind(k, f"input_map {name!r}")
                    if first is _EMPTY_KIND:
                        first, first_key = kind, k
                    elif kind != first:     # (before the name is taken, as the checks above)
                        raise TypeError(f"input_map {name!r}: key {k!r} cannot be ordered with "
                                        f"the key {first_key!r} (all keys of a map are of one "
                                        f"kind: numbers, str, bytes or tuples)")
                if first == "tuple":
                    _check_shapes(data, f"input_map {name!r}")
        self._stamp = 0
        self._anchor = rt.input(name, Stamp(0))   # reserves the name; ValueError if taken
        self._anchor_get = self._anchor.get
        IncrMap.__init__(self, rt, name)
        self._key_inputs = {}
        self._mode = MODE_INPUT
        if data is not None:
            if simple:
                # one simple key type (the common case): checked once, not per key
                self._kind = _KINDS[next(iter(kinds))]
                self._data = data
            else:
                for k, v in data.items():
                    self._put(k, v)
            self._log.clear()       # a consumer's first run reads everything anyway
            self._log_start = 0
            self._keep_all()        # its own copy of each mutable value

    @property
    def revision(self) -> int:
        """The input's own change counter (for tests)."""
        return self._stamp

    def delete(self, key: Any) -> None:
        """Remove ``key`` (KeyError if it is not there)."""
        try:
            there = key in self._data
        except TypeError:                       # unhashable: say which map and which key
            _key_kind(key, f"input_map {self.label!r}: delete")
            raise
        if not there:
            raise KeyError(key)
        self._apply({}, (key,))

    def update(self, mapping: Any = (), *, delete: Any = ()) -> None:
        """Set every ``(key, value)`` of ``mapping`` and remove every key of ``delete``
        (missing ones are ignored; a key in both ends up removed), as one revision: all of
        it or, on a bad key or an interrupt, none of it. ``delete`` is a collection of keys
        (a str or bytes there is a TypeError: pass ``[key]``)."""
        sets = _pairs(mapping, f"input_map {self.label!r}: update")
        if isinstance(delete, (str, bytes)):
            raise TypeError(f"input_map {self.label!r}: update: delete= needs a collection of "
                            f"keys, got the {type(delete).__name__} {delete!r:.60}; to delete "
                            f"that one key pass delete=[{delete!r:.60}]")
        try:
            gone = tuple(delete)
            set(gone)
        except TypeError as e:
            raise TypeError(f"input_map {self.label!r}: update: delete= needs an iterable of keys, got "
                            f"{delete!r:.60} ({e})") from None
        self._apply(sets, gone)

    # reads: per key inside a cell, plain outside
    def _key_input(self, key: Any) -> Input:
        inp = self._key_inputs.get(key)
        if inp is None:
            inp = Input(self._rt, f"{self.label}[{key!r}]", self._data.get(key, _ABSENT))
            self._key_inputs[key] = inp
        return inp

    def _in_cell(self) -> bool:
        cur = current()
        if cur is self._rt:
            return self._rt._running() is not None
        _refuse_foreign(self, cur)          # IncrError inside a cell of another runtime
        return False

    def __getitem__(self, key: Any) -> Any:
        try:
            v = self._key_input(key).get() if self._in_cell() else self._data.get(key, _ABSENT)
        except TypeError:                       # unhashable: say which map and which key
            _refuse_key(self, key, "[]")
            raise
        if v is _ABSENT:
            raise KeyError(key)
        return v

    def get(self, key: Any, default: Any = None) -> Any:
        try:
            v = self._key_input(key).get() if self._in_cell() else self._data.get(key, _ABSENT)
        except TypeError:
            _refuse_key(self, key, "get")
            raise
        return default if v is _ABSENT else v

    def __contains__(self, key: object) -> bool:
        try:
            if self._in_cell():
                return self._key_input(key).get() is not _ABSENT
            return key in self._data
        except TypeError:
            _refuse_key(self, key, "in")
            raise

    def _demand(self) -> Any:
        if self._in_cell():
            return Cell.__call__(self)
        return self._view()


class _OneUp(IncrMap):
    """A map computed key by key from one upstream map (its run: MapBase.drive_one_up)."""

    __slots__ = ()

    def __init__(self, up: IncrMap, label: str, fn: Any, mode: int) -> None:
        IncrMap.__init__(self, up._rt, label)
        self._up = up
        self._seen = -1
        self._fn = PerKeyFn(self, fn)
        self._mode = mode

    def _compute(self, key: Any, value: Any) -> Any:   # MODE_HOOKS: the new entry, or _ABSENT
        raise NotImplementedError

    def _apply(self, results: dict) -> None:            # MODE_HOOKS
        raise NotImplementedError

    def _restart(self) -> None:
        """A hook's _apply was cut short (a Ctrl-C, an error) with its own bookkeeping half
        updated: forget the content, so that the next run reads every upstream key again and
        every consumer, being behind the new log, reads everything (O(n), once). What a
        per-key instance computed is kept (its cell is not run again)."""
        self._data = {}
        self._sorted = None
        self._log_start, self._log = self._log_start + len(self._log) + 1, []
        self._seen = -1
        self._pending = set()


class _MapNode(_OneUp):
    __slots__ = ()

    def __init__(self, up: IncrMap, fn: Any) -> None:
        _OneUp.__init__(self, up, f"{up.label}.map({_fn_label(fn)})", fn, MODE_MAP)


class _FilterNode(_OneUp):
    __slots__ = ()

    def __init__(self, up: IncrMap, pred: Any) -> None:
        _OneUp.__init__(self, up, f"{up.label}.filter({_fn_label(pred)})", pred, MODE_FILTER)


class _MapKeysNode(_OneUp):
    __slots__ = ('_dst', '_src')

    def __init__(self, up: IncrMap, fn: Any) -> None:
        _OneUp.__init__(self, up, f"{up.label}.map_keys({_fn_label(fn)})", fn, MODE_HOOKS)
        self._dst: dict = {}     # upstream key -> key here
        self._src: dict = {}     # key here -> upstream key

    def _compute(self, key: Any, value: Any) -> Any:
        nk = self._fn(self._rt, key, (key,))
        _key_kind(nk, self.label)
        return (nk, value)

    def _apply(self, results: dict) -> None:
        try:
            clash = self._apply_keys(results)
        except BaseException:
            self._dst, self._src = {}, {}
            self._restart()
            raise
        if clash is not None:
            nk, a, b = clash
            self._pending.clear()
            self._pending.add(b)   # tried again at the next run
            raise ValueError(f"{self.label}: keys {a!r} and {b!r} both map to {nk!r}")

    def _apply_keys(self, results: dict) -> Any:
        # moves and removals first, so that keys can trade places within one change
        for key in results:
            old = self._dst.pop(key, _ABSENT)
            if old is not _ABSENT:
                del self._src[old]
                r = results[key]
                if r is _ABSENT or r[0] != old or type(r[0]) is not type(old):
                    self._del(old)
        clash = None
        for key, r in results.items():
            if r is _ABSENT:
                self._fn.drop(key)
                continue
            nk, v = r
            other = self._src.get(nk, _ABSENT)
            if other is not _ABSENT:
                clash = clash or (nk, other, key)
                continue
            self._src[nk] = key
            self._dst[key] = nk
            self._put(nk, v)
        return clash


class _JoinNode(IncrMap):
    __slots__ = ('_l', '_r', '_how', '_seen_l', '_seen_r')

    def __init__(self, left: IncrMap, right: IncrMap, how: str) -> None:
        if how not in ("inner", "left", "outer"):
            raise ValueError(f"join: how must be 'inner', 'left' or 'outer', got {how!r}")
        if not isinstance(right, IncrMap) or right._rt is not left._rt:
            raise TypeError("join: the other map must be an incremental map of the same runtime")
        label = f"{left.label}.join({right.label}" + (")" if how == "inner" else f", {how!r})")
        IncrMap.__init__(self, left._rt, label)
        self._l, self._r, self._how = left, right, how
        self._seen_l = self._seen_r = -1

    def _drive(self) -> MapView:
        self._ran_from = self._log_start + len(self._log)
        self._seen_l = self._pull(self._l, self._seen_l, self._data)
        self._seen_r = self._pull(self._r, self._seen_r, self._data)
        ld, rd, how = self._l._data, self._r._data, self._how
        for key in self._pending:
            a = ld.get(key, _ABSENT)
            b = rd.get(key, _ABSENT)
            if a is not _ABSENT and b is not _ABSENT:
                self._put(key, (a, b))
            elif how == "left" and a is not _ABSENT:
                self._put(key, (a, None))
            elif how == "outer" and (a is not _ABSENT or b is not _ABSENT):
                self._put(key, (None if a is _ABSENT else a, None if b is _ABSENT else b))
            else:
                self._del(key)
        self._pending.clear()
        return self._view()


class _GroupByNode(_OneUp):
    __slots__ = ('_group_of', '_members', '_gsorted', '_gver')

    def __init__(self, up: IncrMap, fn: Any) -> None:
        _OneUp.__init__(self, up, f"{up.label}.group_by({_fn_label(fn)})", fn, MODE_HOOKS)
        self._group_of: dict = {}
        self._members: dict = {}    # group -> {key: value} (live; a Group reads it)
        self._gsorted: dict = {}    # group -> (its members dict, its keys sorted)
        self._gver = 0

    def _compute(self, key: Any, value: Any) -> Any:
        g = self._fn(self._rt, key, (key, value))
        _key_kind(g, self.label)
        return (g, value)

    def _apply(self, results: dict) -> None:
        try:
            self._apply_groups(results)
        except BaseException:
            self._group_of, self._members, self._gsorted = {}, {}, {}
            self._restart()
            raise

    def _apply_groups(self, results: dict) -> None:
        touched = set()
        for key, r in results.items():
            old = self._group_of.pop(key, _ABSENT)
            if old is not _ABSENT:
                self._members[old].pop(key, None)
                touched.add(old)
            if r is _ABSENT:
                self._fn.drop(key)
                continue
            g, v = r
            self._group_of[key] = g
            self._members.setdefault(g, {})[key] = v
            touched.add(g)
        for g in touched:
            mem = self._members.get(g)
            self._gsorted.pop(g, None)
            if not mem:
                self._members.pop(g, None)
                self._del(g)
            else:
                # O(1): a Group reads the live members; its version makes it unequal to the
                # group's previous value (so the change is logged and cutoff does not stop it)
                self._gver += 1
                self._put(g, Group(self, g, mem, self._gver))

    def _group_keys(self, g: Any, mem: dict) -> list:
        c = self._gsorted.get(g)
        if c is None or c[0] is not mem or len(c[1]) != len(mem):
            c = (mem, sorted(mem))
            if self._members.get(g) is mem:
                self._gsorted[g] = c
        return c[1]


class Fold(FoldBase):
    """A value folded from a map, kept up to date one changed key at a time: a cell with no
    arguments (``total()``, ``rt.observe(total)``, ``rt.explain(total)``)."""

    __slots__ = ()   # (its fields are FoldBase's, compiled; so is its run)

    def __init__(self, up: IncrMap, kind: str, label: str, *, identity: Any = None,
                 op: Any = None, k: int = 0, keyfn: Any = None, add: Any = None,
                 remove: Any = None) -> None:
        NodeBase.__init__(self, up._rt, label)
        self._up = up
        self._seen = -1
        self._kindname = kind
        self._keyfn = keyfn
        self._add, self._remove = add, remove
        self._acc = identity
        self._vals = {}
        self._tree = None
        if kind == "sum":
            self._tree = SumFold(identity)
        elif kind in ("min", "max"):
            self._tree = MinMaxFold(kind, identity)
        elif kind in ("top_k", "reduce"):
            self._tree = FoldTree(kind, op=op, identity=identity, k=k)

    def _own_keys(self) -> list:
        if self._tree is not None:
            return self._tree.keys()
        return list(self._vals)



def input_map(rt: Any, name: str, mapping: Any = None) -> InputMap:
    """Declare the keyed input ``name`` on ``rt`` with its first entries.

    Keys are None, bool, int, float, str, bytes or tuples of them, one kind per map (they are
    kept in order); NaN is not a key (ValueError). Raises ValueError if an input of that name
    exists.
    """
    return InputMap(rt, name, mapping)
