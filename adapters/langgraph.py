"""incr as LangGraph's cache and incremental backend (``pip install 'incr[langgraph]'``).

Three pieces, each usable alone:

- :class:`IncrCache` — a LangGraph ``BaseCache`` (sync and async) on incr's LMDB store. Its
  keys add the node's *code identity* (module, qualified name, a hash of the code object and
  of what its closure holds) to LangGraph's own key, so editing a node's body invalidates its
  entries, which LangGraph's ``InMemoryCache``/``SqliteCache`` do not do. Nothing is pickled:
  values are incr's canonical encoding, or LangGraph's msgpack under its strict allowlist;
  every record has incr's header and checksum, and a damaged or foreign record is a miss.
- :func:`incremental` — makes a graph node an incr cell. The node receives the state through a
  read-tracking mapping: each field it reads is an incr ``Input`` (one per node and field), so
  invoking the compiled graph again with one state field changed re-runs only the nodes that
  read it (and, through early cutoff, only those whose input state actually changed); every
  other node returns its previous update without running.
- LLM nodes inside a graph: an incremental node may call an ``@incr.llm`` node (generator plus
  validators). A validator NACK makes that node generate again inside the same step;
  ``rt.nack(...)`` after an invoke, or ``raise incr.Reject(...)`` from a downstream incremental
  node that consumed the candidate, reopens that LLM node only, at the next invoke.

>>> import operator
>>> from typing import TypedDict
>>> from langgraph.graph import StateGraph, START, END
>>> import incr
>>> from incr.adapters.langgraph import incremental
>>> class S(TypedDict, total=False):
...     a: int
...     b: int
...     da: int
...     db: int
>>> ran = []
>>> @incremental
... def double_a(state: S) -> dict:
...     ran.append("a")
...     return {"da": 2 * state["a"]}
>>> @incremental
... def double_b(state: S) -> dict:
...     ran.append("b")
...     return {"db": 2 * state["b"]}
>>> g = StateGraph(S)
>>> _ = g.add_node("double_a", double_a); _ = g.add_node("double_b", double_b)
>>> _ = g.add_edge(START, "double_a"); _ = g.add_edge("double_a", "double_b")
>>> _ = g.add_edge("double_b", END)
>>> app = g.compile()
>>> with incr.Runtime():
...     app.invoke({"a": 1, "b": 2})["db"], app.invoke({"a": 1, "b": 5})["db"]
(4, 10)
>>> ran                      # the second invoke ran double_b only
['a', 'b', 'b']

Internal invariants: a record in the ``langgraph`` database always starts with incr's record
header (kind :data:`KIND_LANGGRAPH`) and its key is ``hash(namespace) + hash(code identity,
LangGraph key)``, so ``clear(namespaces)`` is a prefix scan; an incremental node's inputs hold
the state it was last invoked with before its cell is demanded.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import sys
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import msgpack

import incr
from incr import keys as _keys
from incr.store import FORMAT, HEADER, MAGIC, MAX_RECORD, DamagedRecordWarning, Store

try:
    from langgraph.cache.base import BaseCache, FullKey, Namespace
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
except ImportError as e:  # pragma: no cover - only without the extra
    raise ImportError(
        "incr.adapters.langgraph needs LangGraph: pip install 'incr[langgraph]' "
        f"(langgraph>=1.0). ({e})") from e

__all__ = ["IncrCache", "Incremental", "incremental", "code_identity", "canonical_key",
           "KIND_LANGGRAPH"]

KIND_LANGGRAPH = 3          # record kind of a cache entry (1: cell entry, 2: LLM node state)
DB_NAME = b"langgraph"
# serde types a stored record may carry; "pickle" (or anything else) is never written and a
# record that carries it is a miss. "incr" is incr's own canonical codec (keys.encode).
_SERDE_TYPES = frozenset({"msgpack", "json", "null", "bytes", "bytearray"})
_RECORD_FORMAT = 2          # records without it (IncrCache before 2: writes only) are misses
_SCHEMA = {"ns": list, "key": str, "code": str, "enc": str, "val": bytes}


# --- code identity -----------------------------------------------------------------------------

_ident_memo: "weakref.WeakKeyDictionary[Any, tuple[str, bool]]" = weakref.WeakKeyDictionary()


def code_identity(fn: Any) -> tuple[str, bool]:
    """The identity of a node's code across processes, and whether it is exact.

    ``module.qualname@<hash>``, the hash covering the code object (bytecode, constants, names,
    defaults, nested functions) and what its closure holds when that can be named; for an incr
    cell, the cell's identity (``version=`` when it has one). The flag is False when part of
    the closure could be named only by its type. Like incr's cells, it cannot see globals the
    function reads nor helpers it calls: give such a node a version (``IncrCache.watch(graph,
    versions={"node": "2"})`` or ``@incremental(version="2")``).

    Runtime complexity: O(size of the code object), memoized per function object.

    >>> code_identity(len)[0].startswith("builtins.len@")
    True
    """
    try:
        hit = _ident_memo.get(fn)
    except TypeError:
        hit = None
    if hit is not None:
        return hit
    out = _compute_identity(fn)
    try:
        _ident_memo[fn] = out
    except TypeError:
        pass
    return out


def _compute_identity(fn: Any) -> tuple[str, bool]:
    own = getattr(fn, "_incr_lg_identity", None)
    if own is not None:                    # an @incremental node: its cell's identity
        return own
    if getattr(fn, "_incr_is_cell", False):
        ident = _keys.cell_identity(fn)
        return (ident, True) if ident is not None else (f"{fn.name}@inexact", False)
    if isinstance(fn, functools.partial):
        inner, exact = code_identity(fn.func)
        try:
            extra = _keys.encode([list(fn.args), dict(fn.keywords)])
        except TypeError:
            extra, exact = repr(type(fn.args)).encode(), False
        return f"{inner}+partial:{_keys.checksum(extra).hex()}", exact
    if inspect.ismethod(fn):
        inner, exact = code_identity(fn.__func__)
        return f"{inner}+self:{type(fn.__self__).__qualname__}", False
    target = fn
    if not hasattr(fn, "__code__") and callable(fn) and hasattr(type(fn), "__call__") \
            and not inspect.isbuiltin(fn):
        target = type(fn).__call__          # a callable object: the code of its __call__
    name = f"{getattr(fn, '__module__', None) or '?'}." \
           f"{getattr(fn, '__qualname__', None) or type(fn).__qualname__}"
    parts = [_keys.code_fingerprint(target)] if hasattr(target, "__code__") else \
        [f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', '')}".encode()]
    exact = True
    if hasattr(target, "__code__"):
        cfp, exact = _keys.closure_fingerprint(target)
        parts.append(cfp)
    wrapped = getattr(fn, "__wrapped__", None)     # a decorator: the decorated code counts too
    if wrapped is not None and wrapped is not fn:
        w, wexact = code_identity(wrapped)
        parts.append(w.encode())
        exact = exact and wexact
    if target is not fn and hasattr(fn, "__dict__"):
        try:
            parts.append(_keys.encode(dict(vars(fn))))
        except TypeError:
            exact = False
    h = _keys.checksum(b"\0".join(parts)).hex()
    return f"{name}@{h}", exact


def _is_task(obj: Any) -> bool:
    """A functional-API ``@task`` (langgraph.func's task function object)."""
    return type(obj).__name__ == "_TaskFunction" and callable(getattr(obj, "func", None))


def _task_func(obj: Any) -> Any:
    """The function a ``@task`` wraps; anything else as it is."""
    return obj.func if _is_task(obj) else obj


def _identifier(fn: Any) -> str | None:
    """The name LangGraph gives a task's function in its cache namespace (``identifier``)."""
    from langgraph.pregel._call import identifier
    return identifier(fn)


def _unwrap_node(obj: Any) -> Any:
    """The function behind a LangGraph node (StateNodeSpec, PregelNode, RunnableCallable)."""
    obj = getattr(obj, "runnable", obj)             # StateNodeSpec
    obj = getattr(obj, "bound", obj)                # PregelNode
    steps = getattr(obj, "steps", None)             # RunnableSeq: its first step is the node
    if steps:
        obj = steps[0]
    return getattr(obj, "func", None) or getattr(obj, "afunc", None) or obj


def _resolve(identifier: str) -> Any:
    """The function named ``module.qualname`` in an already imported module, or None.

    Attribute lookups only: nothing is imported and nothing is evaluated."""
    if "<" in identifier:                # <locals>, <lambda>: not reachable by name
        return None
    parts = identifier.split(".")
    for i in range(len(parts) - 1, 0, -1):
        mod = sys.modules.get(".".join(parts[:i]))
        if mod is None:
            continue
        obj: Any = mod
        for p in parts[i:]:
            obj = inspect.getattr_static(obj, p, None) if not inspect.ismodule(obj) \
                else vars(obj).get(p)
            if obj is None:
                break
        if obj is not None and callable(obj):
            return obj
    return None


def canonical_key(*args: Any, **kwargs: Any) -> bytes:
    """A ``CachePolicy(key_func=...)`` that keys on incr's canonical encoding of the node's
    input (type-exact, dict order free), falling back to LangGraph's default key for values
    incr cannot encode.

    >>> canonical_key({"a": 1, "b": 2}) == canonical_key({"b": 2, "a": 1})
    True
    """
    try:
        return b"incr:" + _keys.encode([list(args), kwargs])
    except TypeError:
        from langgraph._internal._cache import default_cache_key
        k = default_cache_key(*args, **kwargs)
        return b"lg:" + (k.encode() if isinstance(k, str) else k)


# --- the cache -------------------------------------------------------------------------------

_stores: dict[str, list] = {}          # abspath -> [Store, users]: one environment per process
_stores_lock = threading.Lock()


def _open_store(path: Any) -> Store:
    p = os.path.abspath(os.fspath(path))
    with _stores_lock:
        slot = _stores.get(p)
        if slot is None or slot[0].env is None:
            try:
                st = Store(p, count_run=False)
            except incr.StoreError:
                raise
            except Exception as e:       # lmdb: "already open in this process"
                raise incr.StoreError(
                    f"IncrCache: cannot open {p} ({e}). An incr.Runtime using this directory "
                    f"in this process holds it: give the cache its own directory, e.g. "
                    f"{p}-langgraph") from None
            slot = _stores[p] = [st, 0]
        slot[1] += 1
        return slot[0]


def _release_store(st: Store) -> None:
    with _stores_lock:
        slot = _stores.get(st.path)
        if slot is None or slot[0] is not st:
            return
        slot[1] -= 1
        if slot[1] <= 0:
            del _stores[st.path]
            st.close()


class IncrCache(BaseCache):
    """LangGraph's node cache on incr's LMDB store, keyed by the node's code identity too.

    ``IncrCache(path)`` opens (creating if missing) an LMDB store at ``path``; an
    ``incr.store.Store`` is used as is. Entries live in the store's ``langgraph`` database.

    >>> import tempfile
    >>> cache = IncrCache(tempfile.mkdtemp())
    >>> ns = ("__pregel_ns_writes", "builtins.len", "count")
    >>> cache.set({(ns, "k"): ([("n", 3)], None)})
    >>> cache.get([(ns, "k")])
    {(('__pregel_ns_writes', 'builtins.len', 'count'), 'k'): [('n', 3)]}
    >>> cache.close()

    - ``get``/``set``/``clear`` and their async twins (``aget`` …, run in a worker thread);
      ``set`` honours LangGraph's ``ttl`` (seconds); an expired entry is a miss and is deleted.
    - The node's code identity comes from the graph when you call :meth:`watch` (needed for
      nodes defined inside functions or lambdas), else from the function LangGraph names in the
      namespace, looked up in already imported modules. A node whose code cannot be found is
      not cached (a miss, one warning), since a stale entry could outlive an edit.
    - Values: any value ``get`` returns is identical to the one given to ``set`` (same types
      at every level, same dict order), or ``set`` refuses it: not cached, one
      ``NotPersistableWarning`` saying why. Stored by incr's canonical codec when it can
      encode them, else by ``serde`` (default: LangGraph's msgpack with its strict allowlist
      and no pickle); LangGraph's node writes (``(channel, value)`` tuples) value by value. A
      ``"pickle"`` payload is never written, and never read, even with a pickling serde.
    - ``hash="blake2b"`` for stores shared with parties you do not trust.

    Raises ``incr.StoreError`` when the store cannot be opened.
    """

    def __init__(self, store: Any, *, serde: Any = None, hash: str = "xxh3_128",
                 nodes: Any = None) -> None:
        super().__init__(serde=serde or JsonPlusSerializer(pickle_fallback=False,
                                                           allowed_msgpack_modules=None))
        if hash not in ("xxh3_128", "blake2b"):
            raise ValueError(f"IncrCache: hash must be 'xxh3_128' or 'blake2b', got {hash!r}")
        if isinstance(store, Store):
            self._store, self._owned = store, False
        else:
            self._store, self._owned = _open_store(store), True
        self.path = self._store.path
        self.hash = hash
        self._db = None
        self._db_env = None
        self._lock = threading.RLock()
        self._watched: dict[Any, tuple[str, bool]] = {}
        self._warned: set[str] = set()
        self.counts = {"hits": 0, "misses": 0, "writes": 0, "refused": 0, "damaged": 0,
                       "expired": 0}
        if nodes is not None:
            self.watch(nodes)

    # -- which code a namespace stands for ---------------------------------------------------

    def watch(self, graph: Any, *, versions: Mapping[str, str] | None = None) -> "IncrCache":
        """Learn the code of every node of ``graph`` (a ``StateGraph``, a compiled graph, or a
        mapping node name -> function), or of functional-API tasks (a ``@task`` function, or
        a list of them); ``versions`` overrides a node's (or task's function name's) code hash
        with a name you bump. Returns the cache, so
        ``builder.compile(cache=IncrCache(p).watch(builder))``.

        Needed for what cannot be found by name: graph nodes and tasks defined inside
        functions, lambdas. Module-level functions and tasks are found without it.
        """
        versions = dict(versions or {})
        if _is_task(graph) or (isinstance(graph, (list, tuple, set, frozenset))
                               and all(callable(t) for t in graph)):
            for t in (graph,) if _is_task(graph) else graph:
                fn = _task_func(t)
                name = _identifier(fn)
                if name is None:
                    continue
                ident = code_identity(fn)
                v = versions.get(getattr(fn, "__name__", "")) or versions.get(name)
                if v is not None:
                    ident = (f"{ident[0].rsplit('@', 1)[0]}@v:{v}", True)
                self._watched[(name, name)] = ident
            return self
        nodes = getattr(graph, "builder", None)
        nodes = getattr(nodes, "nodes", None) or getattr(graph, "nodes", graph)
        for name, spec in dict(nodes).items():
            if name.startswith("__"):
                continue
            fn = _unwrap_node(spec)
            ident = code_identity(fn)
            if name in versions:
                ident = (f"{ident[0].rsplit('@', 1)[0]}@v:{versions[name]}", True)
            mod = getattr(fn, "__module__", None)
            qn = getattr(fn, "__qualname__", None)
            if mod and qn:
                self._watched[(f"{mod}.{qn}", name)] = ident
            self._watched[name] = ident
        return self

    def _code_of(self, ns: Sequence[str]) -> str | None:
        # a graph node: (writes, identifier of its function, node name); a functional-API
        # task: (writes, identifier of its function)
        node = ns[-1] if ns else ""
        ident = ns[1] if len(ns) >= 2 else None
        task = len(ns) == 2
        hit = self._watched.get((ident, node)) or (None if task else self._watched.get(node))
        if hit is None and ident is not None:
            fn = _resolve(ident)
            if fn is not None:
                hit = code_identity(_task_func(fn))
        if hit is None:
            key = "/".join(ns)
            if key not in self._warned:
                self._warned.add(key)
                how = (f"call cache.watch([{node.rsplit('.', 1)[-1]}]) with the task (a task "
                       f"defined inside a function cannot be found by name)" if task else
                       "call cache.watch(graph) with the graph (or its builder) first")
                warnings.warn(
                    f"IncrCache: cannot find the code of {'task' if task else 'node'} "
                    f"{node!r} ({ident}); it is not cached. To cache it, {how}.",
                    incr.NotPersistableWarning, stacklevel=4)
            return None
        return hit[0]

    # -- records -------------------------------------------------------------------------------

    def _env(self):
        env = self._store._env()           # reopened after fork()
        if self._db_env is not env:
            self._db = env.open_db(DB_NAME)
            self._db_env = env
        return env

    def _ns_key(self, ns: Sequence[str]) -> bytes:
        return _keys.digest("langgraph", b"ns\0" + _keys.encode(list(ns)), self.hash)

    def _entry_key(self, ns: Sequence[str], code: str, key: str) -> bytes:
        return self._ns_key(ns) + _keys.digest(
            "langgraph", b"entry\0" + _keys.encode([code, key]), self.hash)

    def _pack_value(self, v: Any) -> tuple[str, bytes]:
        """``(enc, bytes)`` that give back exactly ``v`` (same types, same dict order): incr's
        codec when it can, else ``self.serde``. Raises ``_Refused`` saying why not."""
        try:
            b = _keys.encode_value(v)
            if _same(_keys.decode(b), v):
                return "incr", b
        except Exception:
            pass
        try:
            enc, b = self.serde.dumps_typed(v)
        except Exception as e:
            raise _Refused(f"its value cannot be serialized ({type(e).__name__}: {e})") from None
        if enc not in _SERDE_TYPES:
            raise _Refused(f"its value needs the {enc!r} serialization, which IncrCache never "
                           f"stores")
        try:
            same = _same(self.serde.loads_typed((enc, b)), v)
        except Exception:
            same = False
        if not same:
            raise _Refused(f"its value ({type(v).__qualname__}) does not come back identical "
                           f"through the serializer (tuples become lists; types outside "
                           f"allowed_msgpack_modules come back as dicts)")
        return enc, bytes(b)

    def _unpack_value(self, enc: str, b: bytes) -> Any:
        if enc == "incr":
            return _keys.decode(b)
        if enc in _SERDE_TYPES:
            return self.serde.loads_typed((enc, b))
        raise ValueError(f"payload type {enc!r} is not accepted")

    def _encode(self, ns: Sequence[str], key: str, code: str, value: Any,
                ttl: int | None) -> bytes | None:
        # LangGraph's node writes (a deque or list of (channel, value) tuples) are stored
        # channel by channel, so that a value only LangGraph's serde can write still comes
        # back inside a tuple; any other value is stored whole. Either way get() returns a
        # value identical to the one given to set(), or set() refuses it (not cached, one
        # NotPersistableWarning) -- never a different value.
        try:
            if type(value) in (list, deque) and getattr(value, "maxlen", None) is None and all(
                    type(w) is tuple and len(w) == 2 and type(w[0]) is str for w in value):
                enc = "writes"
                val = msgpack.packb(
                    ["deque" if type(value) is deque else "list",
                     [[w[0], *self._pack_value(w[1])] for w in value]], use_bin_type=True)
            else:
                enc, val = self._pack_value(value)
        except _Refused as e:
            return self._refuse(ns, str(e))
        payload = {"ns": list(ns), "key": key, "code": code, "enc": enc, "val": val,
                   "exp": None if ttl is None else time.time() + ttl, "t": time.time(),
                   "fmt": _RECORD_FORMAT}
        body = msgpack.packb(payload, use_bin_type=True)
        return HEADER.pack(MAGIC, FORMAT, KIND_LANGGRAPH, len(body), _keys.checksum(body)) + body

    def _refuse(self, ns: Sequence[str], why: str) -> None:
        self.counts["refused"] += 1
        k = "refuse:" + "/".join(ns)
        if k not in self._warned:
            self._warned.add(k)
            warnings.warn(f"IncrCache: node {ns[-1]!r} is not cached: {why}",
                          incr.NotPersistableWarning, stacklevel=5)
        return None

    def _decode(self, raw: bytes, ns: Sequence[str], key: str, code: str,
                now: float) -> tuple[str, Any]:
        """("hit", writes) | ("expired", None) | ("damaged", reason) | ("miss", None)."""
        if len(raw) < HEADER.size:
            return "damaged", "shorter than a header"
        magic, fmt, kind, length, crc = HEADER.unpack_from(raw)
        if magic != MAGIC or fmt != FORMAT or kind != KIND_LANGGRAPH:
            return "damaged", "not an incr LangGraph record"
        if length > MAX_RECORD or length != len(raw) - HEADER.size:
            return "damaged", "length field does not match"
        body = raw[HEADER.size:]
        if _keys.checksum(body) != crc:
            return "damaged", "checksum mismatch"
        try:
            rec = msgpack.unpackb(body, raw=False, strict_map_key=True, ext_hook=_no_ext)
        except Exception as e:
            return "damaged", f"payload: {type(e).__name__}"
        if type(rec) is not dict or any(type(rec.get(k)) is not t for k, t in _SCHEMA.items()):
            return "damaged", "schema"
        exp = rec.get("exp")
        if exp is not None and type(exp) is not float:
            return "damaged", "schema"
        if rec["ns"] != list(ns) or rec["key"] != key or rec["code"] != code:
            return "miss", None              # another entry under a colliding hash
        enc, val = rec["enc"], rec["val"]
        if enc != "incr" and enc != "writes" and enc not in _SERDE_TYPES:
            return "damaged", f"payload type {enc!r} is not accepted"
        if rec.get("fmt") != _RECORD_FORMAT:
            return "miss", None              # written by an older IncrCache: run the node
        if exp is not None and now >= exp:
            return "expired", None
        try:
            if enc != "writes":
                return "hit", self._unpack_value(enc, val)
            box, items = msgpack.unpackb(val, raw=False, strict_map_key=True,
                                         ext_hook=_no_ext)
            if box not in ("list", "deque") or type(items) is not list or not all(
                    type(i) is list and len(i) == 3 and type(i[0]) is str
                    and type(i[1]) is str and type(i[2]) is bytes for i in items):
                return "damaged", "schema of the writes"
            writes = [(c, self._unpack_value(e, b)) for c, e, b in items]
        except Exception as e:
            return "damaged", f"value: {type(e).__name__}"
        return "hit", deque(writes) if box == "deque" else writes

    # -- BaseCache -------------------------------------------------------------------------

    def get(self, keys: Sequence[FullKey]) -> dict[FullKey, Any]:
        """The cached writes for the keys that have a live entry. O(len(keys)) lookups."""
        if not keys:
            return {}
        out: dict = {}
        drop: list[bytes] = []
        now = time.time()
        with self._lock:
            env = self._env()
            with env.begin(db=self._db, buffers=False) as txn:
                for ns, key in keys:
                    code = self._code_of(ns)
                    if code is None:
                        self.counts["misses"] += 1
                        continue
                    k = self._entry_key(ns, code, key)
                    raw = txn.get(k)
                    if raw is None:
                        self.counts["misses"] += 1
                        continue
                    what, v = self._decode(raw, ns, key, code, now)
                    if what == "hit":
                        self.counts["hits"] += 1
                        out[(ns, key)] = v
                        continue
                    self.counts["misses"] += 1
                    if what == "expired":
                        self.counts["expired"] += 1
                        drop.append(k)
                    elif what == "damaged":
                        self.counts["damaged"] += 1
                        drop.append(k)
                        warnings.warn(
                            f"incr store {self.path}: damaged LangGraph cache record for node "
                            f"{ns[-1]!r} ignored ({v}); the node will run",
                            DamagedRecordWarning, stacklevel=3)
            if drop:
                self._delete(drop)
        return out

    def set(self, pairs: Mapping[FullKey, tuple[Any, int | None]]) -> None:
        """Store writes with their TTLs (seconds, or None), in one LMDB transaction."""
        recs = {}
        for (ns, key), (writes, ttl) in pairs.items():
            code = self._code_of(ns)
            if code is None:
                continue
            rec = self._encode(ns, key, code, writes, ttl)
            if rec is not None:
                recs[self._entry_key(ns, code, key)] = rec
        if not recs:
            return
        with self._lock:
            env = self._env()
            with env.begin(write=True, db=self._db) as txn:
                for k in sorted(recs):
                    txn.put(k, recs[k])
            self.counts["writes"] += len(recs)

    def clear(self, namespaces: Sequence[Namespace] | None = None) -> None:
        """Delete the entries of ``namespaces`` (every code version), or all entries."""
        with self._lock:
            env = self._env()
            with env.begin(write=True, db=self._db) as txn:
                if namespaces is None:
                    txn.drop(self._db, delete=False)
                    return
                for ns in namespaces:
                    prefix = self._ns_key(ns)
                    cur = txn.cursor()
                    if cur.set_range(prefix):
                        while cur.key().startswith(prefix):
                            if not cur.delete():
                                break
                            if not cur.key():
                                break

    def _delete(self, ks: list[bytes]) -> None:
        with self._env().begin(write=True, db=self._db) as txn:
            for k in ks:
                txn.delete(k)

    async def aget(self, keys: Sequence[FullKey]) -> dict[FullKey, Any]:
        return await asyncio.to_thread(self.get, keys)

    async def aset(self, pairs: Mapping[FullKey, tuple[Any, int | None]]) -> None:
        await asyncio.to_thread(self.set, pairs)

    async def aclear(self, namespaces: Sequence[Namespace] | None = None) -> None:
        await asyncio.to_thread(self.clear, namespaces)

    def __len__(self) -> int:
        with self._lock:
            with self._env().begin(db=self._db) as txn:
                return txn.stat(self._db)["entries"]

    def close(self) -> None:
        """Release the store (closed when its last user in this process releases it)."""
        if self._owned and self._store is not None:
            _release_store(self._store)
        self._store = None


class _Refused(Exception):
    """A value IncrCache.set will not store, and why."""


def _same(a: Any, b: Any, depth: int = 0) -> bool:
    """``a`` and ``b`` are the same value: equal, with the same types at every level of
    lists, tuples, deques and dicts, and dicts in the same order (NaN is NaN)."""
    if type(a) is not type(b) or depth > 500:
        return False
    t = type(a)
    if t is float:
        return a == b or (a != a and b != b)
    if t in (list, tuple, deque):
        return len(a) == len(b) and getattr(a, "maxlen", None) == getattr(b, "maxlen", None) \
            and all(_same(x, y, depth + 1) for x, y in zip(a, b))
    if t is dict:
        return len(a) == len(b) and all(
            _same(ka, kb, depth + 1) and _same(a[ka], b[kb], depth + 1)
            for ka, kb in zip(a, b))
    try:
        return bool(a == b)
    except Exception:
        return False


def _no_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"extension type {code} in a record envelope")


# --- incremental nodes ------------------------------------------------------------------------


class _Missing:
    """The value of a state field the node's state does not hold."""

    __slots__ = ()

    def __eq__(self, other: Any) -> bool:
        return type(other) is _Missing

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "<missing>"


MISSING = _Missing()
_keys.register_type(_Missing, lambda _m: 0, lambda _x: MISSING)
_KEYS_FIELD = "\0keys"       # the input holding which fields the state has (iteration reads it)


class _Session:
    """One runtime's inputs for incremental nodes, and the lock that serializes them."""

    def __init__(self, rt: Any):
        self.rt = rt
        self.inputs: dict[str, Any] = {}
        self.fields: dict[str, set] = {}          # node key -> fields it was ever given
        self.lock = threading.RLock()

    def input(self, name: str, value: Any) -> Any:
        i = self.inputs.get(name)
        if i is None:
            i = self.inputs[name] = self.rt.input(name, value)
        else:
            i.set(value)
        return i


_sessions_lock = threading.Lock()


def _session(rt: Any) -> _Session:
    # kept on the runtime itself (rt.extensions), so it lives and dies with it
    with _sessions_lock:
        s = rt.extensions.get("langgraph")
        if s is None:
            s = rt.extensions["langgraph"] = _Session(rt)
        return s


class Incremental:
    """Incremental nodes on one runtime: ``inc = Incremental(rt)``, then
    ``builder.add_node("name", inc.node(fn))``. Same as :func:`incremental` with
    ``runtime=rt``."""

    def __init__(self, runtime: Any):
        self.runtime = runtime

    def node(self, fn: Callable | None = None, *, version: str | None = None) -> Any:
        return incremental(fn, runtime=self.runtime, version=version)


_call: Any = None          # contextvar: (session, node key, config) of the demand in progress


class _StateView(Mapping):
    """The state as the node's cell sees it: every field read is an incr dependency."""

    __slots__ = ("_s", "_prefix")

    def __init__(self, session: _Session, prefix: str):
        self._s = session
        self._prefix = prefix

    def _read(self, field: str) -> Any:
        i = self._s.inputs.get(self._prefix + field)
        if i is None:
            # a field this node was never given: depend on the set of fields, so that its
            # arrival runs the node again
            keys_input = self._s.inputs.get(self._prefix + _KEYS_FIELD)
            if keys_input is not None:
                keys_input.get()
            return MISSING
        return i.get()

    def __getitem__(self, field: str) -> Any:
        v = self._read(field)
        if v is MISSING or type(v) is _Missing:
            raise KeyError(field)
        return v

    def get(self, field: str, default: Any = None) -> Any:
        v = self._read(field)
        return default if type(v) is _Missing else v

    def __contains__(self, field: object) -> bool:
        return isinstance(field, str) and type(self._read(field)) is not _Missing

    def __iter__(self):
        return iter(self._read(_KEYS_FIELD))

    def __len__(self) -> int:
        return len(self._read(_KEYS_FIELD))

    def __getattr__(self, field: str) -> Any:     # attribute-style states (dataclass, pydantic)
        if field.startswith("_"):
            raise AttributeError(field)
        v = self._read(field)
        if type(v) is _Missing:
            raise AttributeError(field)
        return v

    def __repr__(self) -> str:
        return f"<incr state view {dict(self)!r}>"


def _fields_of(state: Any) -> dict:
    if isinstance(state, Mapping):
        return dict(state)
    if hasattr(state, "__dict__"):
        return {k: v for k, v in vars(state).items() if not k.startswith("_")}
    raise TypeError(f"incremental node: the state must be a mapping or an object with "
                    f"fields, got {type(state).__qualname__}")


def _node_key(config: Any, fn: Callable) -> str:
    """The node's name in its graph (with the names of enclosing subgraph nodes)."""
    if config is None:
        try:
            from langgraph.config import get_config
            config = get_config()
        except Exception:        # called outside a graph run
            config = None
    meta = (config or {}).get("metadata") or {}
    name = meta.get("langgraph_node") or getattr(fn, "__qualname__", "node")
    ns = str(meta.get("langgraph_checkpoint_ns") or "")
    outer = [part.split(":", 1)[0] for part in ns.split("|")[:-1] if part]
    return "/".join(outer + [name])


def incremental(fn: Callable | None = None, /, *, runtime: Any = None,
                version: str | None = None) -> Any:
    """Make a LangGraph node incremental: it runs only when a state field it read changed.

    The node body runs as an incr cell. It receives a read-only mapping over its state (also
    readable by attribute) whose every field read — ``state["x"]``, ``state.get("x")``,
    ``"x" in state``, ``state.x``; iteration reads the set of fields — is recorded as a
    dependency on an incr ``Input`` (one per node and field, set from the state the node is
    invoked with). At the next invoke, a node none of whose read fields changed returns its
    previous update without running; a node that runs again and returns an equal update stops
    the propagation (early cutoff), so the nodes after it see an unchanged state.

    ``runtime``: the incr runtime to run on; default: the one active where the graph is
    invoked (``with rt: app.invoke(...)``; LangGraph carries it into its worker threads).
    ``version``: names the node's definition for persistent stores (else its code hash).

    Runtime complexity: O(fields of the state) to set the inputs, plus the cost of verifying
    the node's cell (O(fields it read)) — the body runs only when one of them changed.

    Limits: state values should be encodable by incr (None, bool, int, float, str, bytes,
    tuple, list, dict with str keys, frozenset, registered types) to be stored and compared by
    value; others work in memory when ``==`` compares them by value. The node's ``config``
    (if it takes one) is passed but not tracked. A sync node runs one at a time per runtime
    (parallel branches are serialized); an ``async def`` node is an async cell, and under
    ``ainvoke``/``astream`` parallel branches run concurrently.

    Raises TypeError for a node that asks LangGraph for injected arguments other than
    ``config``.
    """
    if fn is None:
        return lambda f: incremental(f, runtime=runtime, version=version)
    is_async = inspect.iscoroutinefunction(fn)
    params = inspect.signature(fn).parameters
    extra = [p for p in list(params)[1:] if p not in ("config",)
             and params[p].default is inspect.Parameter.empty
             and params[p].kind not in (inspect.Parameter.VAR_POSITIONAL,
                                        inspect.Parameter.VAR_KEYWORD)]
    if extra:
        raise TypeError(f"incremental: {fn.__qualname__} asks for {extra}; an incremental "
                        f"node may take (state) or (state, config)")
    wants_config = "config" in params
    ident, exact = code_identity(fn)
    if version is not None:
        ident, exact = f"{ident.rsplit('@', 1)[0]}@v:{version}", True

    def body(node_key: str) -> Any:
        # `ident` is read so that the closure (hence the cell's identity, when the node's own
        # closure cannot be named exactly) carries the node's code hash
        session, _key, config = _call.get() + (ident,)[:0]
        view = _StateView(session, f"lg:{node_key}:")
        return fn(view, config) if wants_config else fn(view)

    if is_async:
        async def body(node_key: str) -> Any:  # noqa: F811 - the async twin
            session, _key, config = _call.get() + (ident,)[:0]
            view = _StateView(session, f"lg:{node_key}:")
            return await (fn(view, config) if wants_config else fn(view))

    body.__module__ = getattr(fn, "__module__", body.__module__)
    body.__qualname__ = getattr(fn, "__qualname__", body.__qualname__)
    body.__name__ = getattr(fn, "__name__", body.__name__)
    # the cell's identity is the node's code (exact), not the generic body above
    cell = incr.cell(body, version=f"lg:{ident.rsplit('@', 1)[1]}" if exact else version)

    @functools.wraps(fn)
    def node(state: Any, config: Any = None) -> Any:
        rt = runtime if runtime is not None else incr.current()
        session = _session(rt)
        node_key = _node_key(config, fn)
        fields = _fields_of(state)
        with session.lock:
            token = _call.set((session, node_key, config))
            try:
                with rt:
                    _set_fields(rt, session, node_key, fields)
                    out = cell(node_key)
            finally:
                _call.reset(token)
        return dict(out) if type(out) is dict else out

    if is_async:
        # under ainvoke: parallel branches are tasks of one loop; the inputs are set under
        # the session's lock (no await inside it), the cell is awaited outside it
        @functools.wraps(fn)
        async def node(state: Any, config: Any = None) -> Any:  # noqa: F811
            rt = runtime if runtime is not None else incr.current()
            session = _session(rt)
            node_key = _node_key(config, fn)
            fields = _fields_of(state)
            with session.lock:
                _set_fields(rt, session, node_key, fields)
            token = _call.set((session, node_key, config))
            try:
                with rt:
                    out = await cell.aget(node_key)
            finally:
                _call.reset(token)
            return dict(out) if type(out) is dict else out

    node._incr_lg_identity = (ident, exact)   # what IncrCache keys this node by
    node.cell = cell
    node.__signature__ = inspect.signature(fn)  # LangGraph passes config only if fn takes it
    return node


def _set_fields(rt: Any, session: Any, node_key: str, fields: dict) -> None:
    """The node's inputs from the state it is invoked with, as one revision (the session's
    lock held): every field it has ever seen, MISSING for one absent now."""
    prefix = f"lg:{node_key}:"
    known = session.fields.setdefault(node_key, set())
    known.update(fields)
    with rt.batch():
        session.input(prefix + _KEYS_FIELD, frozenset(fields))
        for f in known:
            session.input(prefix + f, fields.get(f, MISSING))


import contextvars as _contextvars  # noqa: E402 - kept next to its only use

_call = _contextvars.ContextVar("incr_langgraph_call")
