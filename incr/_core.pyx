# cython: language_level=3
"""The engine (internal): trace, revisions, change propagation. See _core.pxd for the data model.

How a change flows:

1. ``Input.set`` ticks the clock, bumps the revision (once per batch) and pushes dirtiness to
   every transitive dependent that is not dirty yet (``dirty_from``). Cost: O(newly dirty).
2. Demanding a dirty instance verifies it without recursion (``ensure``): an explicit stack walks
   its recorded dependencies in read order, brings each dirty one up to date first, and re-runs
   the instance as soon as one dependency is found changed (the rest are then re-read by the run
   itself, so a branch the new run no longer takes is never touched: Salsa's order). An instance
   whose dependencies are all unchanged is marked verified without running.
3. A run records what it reads; a recomputed value equal to the old one (per the cell's cutoff)
   keeps the old value and ``changed_at``, so nothing that read it runs (early cutoff).
4. ``stabilize`` does step 2 for every dirty observed instance, in timestamp order, then calls
   the observers' callbacks once everything is up to date (no callback sees a mix).
"""

import contextvars
cimport cython
import inspect
import time

from cpython.contextvars cimport get_value

cdef extern from "pythread.h":
    unsigned long PyThread_get_thread_ident()

from incr.errors import (CycleError, IncrError, NotPersistableWarning, ReentrancyError, Reject,
                         _Deferred, _Suspend)
from asyncio import CancelledError as _CancelledError
from asyncio import _get_running_loop
from incr.keys import normalize_args
from incr import keys as _keys
from incr.store import DamagedRecordWarning, Store, _index_merge
import msgpack as _msgpack
import warnings as _warnings

# the record codec: a second extension module (see _codec.pxd); the per-dependency helpers
# are inline there and compile into this module
from cpython.bytes cimport PyBytes_AS_STRING
from incr._codec cimport (Record, _u32, _blob_bytes, _blob_equals, _dep_hash_at, _rec_str,
                          _read_record, _pack_record, _index_step, _index_nodes,
                          _decode_simple, _decode_at, _add_usage_tag, _instance_key)
from incr._codec import NOT_SIMPLE as _NOT_SIMPLE
# re-exported: incr.store and the tests import these from here
from incr._codec import (add_usage_tag, decode_simple, index_nodes, instance_key,
                         pack_record_fields, read_record, record_checksum, utf8_valid)
cdef bytes _INDEX_ROOT = bytes(16)   # the root of every instance's index (layout: incr/store.py)

cdef object _active = contextvars.ContextVar("incr_runtime", default=None)
# the frame stack of the async run whose step is running (incr._aio sets it around each
# step), so that tasks the run spawns itself record their reads into it
cdef object _task_frames = contextvars.ContextVar("incr_task_frames", default=None)
cdef object _outer = contextvars.ContextVar("incr_outer_runtimes", default=())
import types as _types
cdef type _CoroutineType = _types.CoroutineType

# Nested runs deeper than this verify the remaining dependencies of an instance before running
# it (see ensure); shallower ones follow Salsa's order exactly.
cdef Py_ssize_t DEEP = 48
# A top-level demand or stabilization absorbs at most this many incr.Reject before giving up
# (each one regenerates the blamed node; the node's own budget bounds it much earlier).
cdef int MAX_REJECTS = 64
# True once an incr.llm node exists: passes then set generator calls aside to run concurrently
cdef bint _run_ahead = False
# incr._aio (imported on first use: it imports this module)
cdef object _aio = None


cdef object _aio_mod():
    global _aio
    if _aio is None:
        from incr import _aio as m
        _aio = m
    return _aio


cdef bint _async_defined = False
cdef str _SUSPEND_MSG = (
    "incr: {what} needs async work (an async cell, or an async generator or validator), and "
    "sync code running inside an event loop cannot wait for it without blocking the loop: "
    "from async code use `await cell.aget(...)`, `await async_cell(...)` or "
    "`await rt.astabilize()`")


def _note_async():
    global _async_defined
    _async_defined = True


cdef inline bint _loop_running():
    return _get_running_loop() is not None


def _task_frames_var():
    return _task_frames


def _active_var():
    """The context variable holding the active runtime (incr._aio sets it in its tasks)."""
    return _active


def _enable_run_ahead():
    global _run_ahead
    _run_ahead = True
_default_runtime = None


import os as _os
import weakref as _weakref
_runtimes = _weakref.WeakSet()       # every live runtime, for the fork handler below


def _after_fork_in_child():
    # A runtime that another thread of the parent was computing on when the process forked is
    # half-way through a run that no thread of the child will finish: it is closed in the
    # child, with an error that says so. (The forking thread's own runtimes go on as they were.)
    cdef Runtime rt
    me = PyThread_get_thread_ident()
    for r in list(_runtimes):
        rt = <Runtime>r
        if rt.busy_depth and rt.busy_thread != me or (rt.frames and rt.owner != me):
            rt.forked_mid_run = (
                "this incr.Runtime was computing in another thread when the process forked, "
                "and that computation does not exist in the child; create a new Runtime in the "
                "child (on the same store, if it has one)")
            rt.closed = True
            rt.busy_depth = 0
            rt.busy_thread = 0


if hasattr(_os, "register_at_fork"):
    _os.register_at_fork(after_in_child=_after_fork_in_child)


def current():
    """The active runtime: the innermost ``with rt:`` in this context, else the process-wide
    in-memory runtime (created on first use)."""
    global _default_runtime
    rt = get_value(_active)
    if rt is not None:
        return rt
    if _default_runtime is None:
        _default_runtime = Runtime()
    return _default_runtime


class _Untracked:
    __slots__ = ("rt", "saved", "worker")

    def __enter__(self):
        cdef Runtime rt = <Runtime>current()
        self.rt = rt
        self.worker = rt.prefetch is not None and rt.prefetch.is_worker()
        if self.worker:     # a generator run ahead in a worker thread: its reads are logged
            rt.prefetch.quiet(1)
        self.saved = rt.quiet_enter()
        return None

    def __exit__(self, *exc):
        (<Runtime>self.rt).quiet = self.saved
        if self.worker:
            (<Runtime>self.rt).prefetch.quiet(-1)
        return False


def gather(*thunks):
    """Demand several things at once; returns their results in order.

    Each argument is a function of no arguments (``lambda: a(1)``); each is called once.
    Inside a cell, or at top level, with work that can run concurrently (the generator calls
    of ``incr.llm`` nodes, in up to ``max_workers`` threads; an executor's runs), that work is
    gathered across all the thunks and done at once -- where calling them one after the other
    would wait for each. The values, the dependencies recorded and the model calls made are
    those of calling them in order: ``[t() for t in thunks]``. (Salsa's ``par_map``.)

    Raises the first exception a thunk raises, as calling them in order would.

    >>> import incr
    >>> @incr.cell
    ... def sq(x):
    ...     return x * x
    >>> with incr.Runtime():
    ...     incr.gather(lambda: sq(2), lambda: sq(3))
    [4, 9]
    """
    for t in thunks:
        if not callable(t):
            raise TypeError(f"incr.gather() takes functions of no arguments (lambda: cell(x)), "
                            f"got {t!r}")
    cdef Runtime rt = <Runtime>current()
    if rt.prefetch is not None and rt.prefetch.reading and rt.prefetch.is_worker():
        return _Gather(thunks).each()   # a generator running ahead: its reads are logged
    if not rt.frames and not rt.stabilizing:
        # at top level: one pass over all of them (one store commit, work gathered)
        rt.check_usable()
        token = _active.set(rt)
        rt.enter()
        try:
            return rt.settle(None, _Gather(thunks))
        finally:
            rt.leave()
            _active.reset(token)
    return _Gather(thunks)()


class _Gather:
    """Call every thunk; if some set work aside (incr.errors._Deferred), go on with the others
    so that all of it is gathered, then raise it: the pass runs the work and calls again."""

    def __init__(self, thunks):
        self.thunks = thunks

    def __call__(self):
        rt = current()
        own = rt._ahead_begin()   # no pass gathers work already: this gather does, in rounds
        rounds = 0
        rt._gathering(1)     # cells demanded here may be shipped to an executor (first runs too)
        try:
            while True:
                try:
                    return self.each()
                except _Suspend:
                    raise
                except _Deferred:
                    if not own:
                        raise          # the pass runs the work, then runs this cell again
                    rounds += 1
                    rt._ahead_round(rounds)
        finally:
            rt._gathering(-1)
            if own:
                rt._ahead_end()

    def each(self):
        out = []
        deferred = None
        for t in self.thunks:
            try:
                out.append(t())
            except _Suspend as d:
                # async work: all of it is gathered into one, done concurrently at the
                # nearest await of incr
                if isinstance(deferred, _Suspend):
                    deferred.works.extend(d.works)
                else:
                    deferred = d
                out.append(None)
            except _Deferred as d:
                if deferred is None:
                    deferred = d
                out.append(None)
            except BaseException as e:
                if deferred is not None and isinstance(e, Exception):
                    raise deferred     # the work set aside comes first; this raises again
                if isinstance(deferred, _Suspend):
                    _aio_mod().abandon(current(), deferred.works)   # an interrupt: dropped
                raise
        if deferred is not None:
            raise deferred
        return out


def untracked(fn=None, *args, **kwargs):
    """Read without recording dependencies.

    ``incr.untracked(fn, *args, **kwargs)`` calls ``fn`` and returns its result;
    ``with incr.untracked(): ...`` does the same for a block. Inside a running cell, inputs
    read and cells demanded there are not recorded as that cell's dependencies: a later
    change of them does not re-run it (the cells demanded still record their own reads and
    stay incremental). Outside a cell it changes nothing. For logging, progress, debugging:
    a value that affects the result must be read tracked, or the result goes stale.

    >>> import incr
    >>> rt = incr.Runtime()
    >>> x = rt.input("x", 1)
    >>> @incr.cell
    ... def f():
    ...     return incr.untracked(x.get)
    >>> with rt:
    ...     f(), x.set(2), f()
    (1, None, 1)
    """
    if fn is None:
        if args or kwargs:
            raise TypeError("incr.untracked(): arguments given without a function")
        return _Untracked()
    if not callable(fn):
        raise TypeError(f"incr.untracked() needs a callable, got {fn!r}")
    with _Untracked():
        return fn(*args, **kwargs)


class _CutoffPolicy:
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"incr.{self.name}"


EQUAL = _CutoffPolicy("EQUAL")
IDENTITY = _CutoffPolicy("IDENTITY")
NEVER = _CutoffPolicy("NEVER")


cdef extern from "math.h":
    bint signbit(double x) nogil


cdef inline bint _same_float(double a, double b):
    if a != a:
        return b != b                   # every NaN is the same value (as in argument keys)
    return a == b and signbit(a) == signbit(b)   # 0.0 and -0.0 are two values


cdef inline bint _same_value(object old, object new):
    # The one rule for Input.set, EQUAL cutoff and argument keys: the same value is the same
    # type and ==, all the way down, with floats compared bit for bit but for NaN (0.0 and
    # -0.0 differ, NaN equals NaN) and dicts compared in order (a reordered dict iterates
    # differently, so it is a changed value). A comparison that raises means "changed".
    cdef type t
    if old is new:
        return True
    t = type(old)
    if t is not type(new):
        return False
    if t is float:
        return _same_float(<double>old, <double>new)
    if t is list or t is tuple or t is dict:
        return _same_deep(old, new)
    if t is frozenset:
        return _same_set(old, new)
    try:
        return bool(old == new)
    except Exception:
        return False


cdef bint _same_set(object a, object b):
    # frozensets have no order to pair their elements by: compare their canonical, type-tagged
    # key forms (frozenset({1}) and frozenset({1.0}) differ, as argument keys do)
    try:
        if not a == b:
            return False
        return _keys.normalize_args("", ("v",), (a,)) == _keys.normalize_args("", ("v",), (b,))
    except Exception:
        return False


cdef bint _same_deep(object old, object new):
    # _same_value for containers, walked on an explicit stack (no recursion). A pair of
    # containers met again (a value that refers to itself) is not walked twice: cyclic values
    # compare as far as they can be told apart, and the walk ends.
    cdef list stack = [old, new]
    cdef set seen = set()
    cdef object a, b, pair
    cdef type t
    cdef Py_ssize_t i, n
    while stack:
        b = stack.pop()
        a = stack.pop()
        if a is b:
            continue
        t = type(a)
        if t is not type(b):
            return False
        if t is list or t is tuple or t is dict:
            pair = (id(a), id(b))
            if pair in seen:
                continue
            seen.add(pair)
        if t is float:
            if not _same_float(<double>a, <double>b):
                return False
        elif t is frozenset:
            if not _same_set(a, b):
                return False
        elif t is list or t is tuple:
            n = len(a)
            if n != len(b):
                return False
            for i in range(n):
                stack.append(a[i])
                stack.append(b[i])
        elif t is dict:
            if len(a) != len(b):
                return False
            for ka, kb in zip(a, b):
                if not _same_value(ka, kb):
                    return False
                stack.append((<dict>a)[ka])
                stack.append((<dict>b)[kb])
        else:
            try:
                if not a == b:
                    return False
            except Exception:
                return False
    return True


cdef inline bint _needs_work(Node n):
    return (n.flags & (F_DIRTY | F_HAS_VALUE)) != F_HAS_VALUE


cdef inline void _add_note(BaseException e, str note):
    try:
        e.add_note(note)
    except AttributeError:  # Python < 3.11 has no notes
        pass


cdef class Node:
    """A vertex of the trace (internal)."""

    def __cinit__(self):
        self.flags = 0
        self.dependents = None

    @property
    def _changed_at(self):
        """The clock tick of the last change of the value (incr.llmnodes, incr.remote)."""
        return self.changed_at

    @property
    def _has_value(self):
        return (self.flags & F_HAS_VALUE) != 0


cdef class Input(Node):
    """A named input of a runtime. Create with ``rt.input(name, value)``."""

    def __init__(self, Runtime rt, str name, object value):
        self.rt = rt
        self.name = name
        self.value = value
        self.flags = F_INPUT | F_HAS_VALUE
        rt.ts_clock += 1
        self.ts = rt.ts_clock
        self.changed_at = rt.clock
        self.changed_rev = rt.revision

    @property
    def _incr_input_name(self):
        return self.name

    def get(self):
        """The current value. Inside a running cell, also records that the cell read it.

        Runtime complexity: O(1).
        """
        cdef Runtime rt = self.rt
        cdef Runtime cur
        if rt.frames:
            if PyThread_get_thread_ident() != rt.owner:
                if rt.prefetch is not None and rt.prefetch.reading and rt.prefetch.is_worker():
                    rt.prefetch.read(self)   # a generator running ahead (an incr.gather)
                    return self.value
                raise IncrError(rt._other_thread())
            rt.record_read(self)
        else:
            if rt.prefetch is not None and rt.prefetch.reading:
                rt.prefetch.read(self)   # a generator running ahead, in a worker thread
            if _async_defined:
                tf = get_value(_task_frames)
                if tf and (<Frame>tf[len(tf) - 1]).node.rt is rt:
                    # a task that an async cell's run spawned (asyncio.gather of a coroutine
                    # of its own): the read belongs to that run
                    rt.record_into(<Frame>tf[len(tf) - 1], self)
                    return self.value
            cur = get_value(_active)
            if cur is not None and cur is not rt and cur.frames:
                raise IncrError(
                    f"input {self.name!r} belongs to another runtime than the one running "
                    f"{(<Frame>cur.frames[-1]).node.label()}; declare it on that runtime")
        return self.value

    def peek(self):
        """The current value, without recording a dependency even inside a running cell (an
        untracked read: a later change of this input does not re-run the reader).

        Runtime complexity: O(1).
        """
        return self.value

    def set(self, value):
        """Give the input a new value; the same value (same type and ==, all the way down;
        0.0 and -0.0 differ, NaN equals NaN, dicts compare in order) changes nothing. Outside
        a batch this commits one revision.

        Runtime complexity: O(instances that become stale).

        Raises ReentrancyError when called from inside a running cell or a stabilization.
        """
        self.rt.set_input(self, value)

    def __reduce__(self):
        # sent to an executor's worker, an input is a reference by name (incr.remote)
        from incr import remote as _remote
        return (_remote.InputRef, (self.name,))

    @property
    def changed_at_revision(self):
        """The revision at which the value last changed."""
        return self.changed_rev

    def __repr__(self):
        return f"Input({self.name!r})"


cdef class Instance(Node):
    """One cell with one set of arguments (internal)."""

    def __init__(self, Cell cell, tuple args, Runtime rt):
        self.cell = cell
        self.args = args
        self.rt = rt
        self.deps = ()
        self.why = None
        self.observed_by = None
        self.last_action = A_NONE
        self.fresh_args = False

    cdef str label(self):
        return _label(self.cell, self.args)

    @property
    def label_text(self):
        return self.label()

    @property
    def _deps(self):
        """What its last run read, in order (incr.remote)."""
        return self.deps

    @property
    def action(self):
        """What happened at its last verification: computed, recomputed, cutoff, reused,
        loaded (from the store), failed or none."""
        return _ACTIONS[self.last_action]

    @property
    def timestamp(self):
        """Position in the trace: every dependency has a smaller timestamp (I4)."""
        return self.ts

    def __repr__(self):
        return f"<incr instance {self.label()}>"


@cython.no_gc
cdef class Persist:
    """An instance's persistent identity and store lookup state (internal)."""
    # Not tracked by the cyclic collector (one fewer tracked object per stored instance):
    # `cands` and `resolved` hold nodes only while a lookup runs, and every way out of a
    # lookup (match, no match, an exception through ensure) sets them back to None.

    def __init__(self):
        self.ok = False
        self.cands = None
        self.resolved = None


cdef class Cell:
    """A memoized, dependency-tracking function. Create with ``@incr.cell``."""

    def __init__(self, fn, *, version=None, cutoff=EQUAL, local=False):
        if not callable(fn):
            raise TypeError(f"incr.cell needs a function, got {fn!r}")
        if inspect.isasyncgenfunction(fn):
            raise TypeError(
                f"incr.cell {getattr(fn, '__qualname__', fn)!r} is an async generator function "
                f"(async def with yield): a cell returns one value; make it an async def that "
                f"returns it, or collect the items into a list.")
        self.is_async = inspect.iscoroutinefunction(fn)
        self.awaited = self.is_async
        if self.is_async:
            _note_async()
        self.fn = fn
        module = getattr(fn, "__module__", None) or "?"
        qual = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
        self.name = f"{module}.{qual}"
        self.qualname_label = qual.rsplit("<locals>.", 1)[-1]  # labels are for people
        self.version = version
        if cutoff is EQUAL:
            self.cutoff_kind = C_EQUAL
        elif cutoff is IDENTITY:
            self.cutoff_kind = C_IDENTITY
        elif cutoff is NEVER:
            self.cutoff_kind = C_NEVER
        elif callable(cutoff):
            self.cutoff_kind = C_CALLABLE
        else:
            raise TypeError(
                f"incr.cell {qual}: cutoff must be incr.EQUAL, incr.IDENTITY, incr.NEVER or a "
                f"callable(old, new) -> bool, got {cutoff!r}")
        self.cutoff = cutoff
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            sig = None
        self.signature = sig
        names = []
        simple = True
        npos = 0
        if sig is not None:
            for p in sig.parameters.values():
                names.append(p.name)
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                    npos += 1
                    if p.default is not p.empty:
                        simple = False
                else:
                    simple = False
        self.param_names = tuple(names)
        self.n_positional = npos
        self.simple = simple and sig is not None
        self.cached_rt = None
        self.cached_table = None
        self.is_llm = False
        self.local = bool(local)
        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
            try:
                setattr(self, attr, getattr(fn, attr))
            except AttributeError:
                pass
        self.__wrapped__ = fn
        _keys.register_cell(self)

    @property
    def _incr_is_cell(self):
        return True

    @property
    def _signature(self):
        return self.signature

    @property
    def _param_names(self):
        return self.param_names

    cdef tuple bound(self, tuple args, dict kwargs):
        # the canonical positional form of a call: defaults applied, keywords placed
        if not kwargs and self.simple and len(args) == self.n_positional:
            return args
        return self.bind(args, kwargs)

    cdef tuple bind(self, tuple args, dict kwargs):
        if self.signature is None:
            if kwargs:
                raise TypeError(f"{self.qualname_label}: cannot take keyword arguments")
            return args
        try:
            ba = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{self.qualname_label}(): {e}") from None
        ba.apply_defaults()
        return tuple(ba.arguments.values())

    cdef object invoke(self, tuple args):
        if self.signature is None or self.n_positional == len(self.param_names):
            return self.fn(*args)
        ba = inspect.BoundArguments(self.signature, dict(zip(self.param_names, args)))
        return self.fn(*ba.args, **ba.kwargs)

    def __call__(self, *args, **kwargs):
        cdef Runtime rt = <Runtime>get_value(_active)
        cdef dict table
        if rt is None:
            rt = <Runtime>current()
        if rt is self.cached_rt:
            table = self.cached_table
        else:
            table = rt.table_for(self)
            self.cached_rt = rt
            self.cached_table = table
        if self.awaited:
            return _aio_mod().call(rt, rt.lookup(self, table, self.bound(args, kwargs), True))
        if _async_defined and not rt.frames:
            tf = get_value(_task_frames)
            if tf and (<Frame>tf[len(tf) - 1]).node.rt is rt:
                # in a task an async cell's run spawned: the demand is that run's read
                return _aio_mod().in_task(rt, rt.lookup(self, table, self.bound(args, kwargs),
                                                        True), tf)
        return rt.demand(rt.lookup(self, table, self.bound(args, kwargs), True))

    def aget(self, *args, **kwargs):
        """Await this cell's value for these arguments (sync or async cell), from async code:
        ``await cell.aget(x)``. Async work it needs runs concurrently with other tasks."""
        cdef Runtime rt = <Runtime>get_value(_active)
        if rt is None:
            rt = <Runtime>current()
        return _aio_mod().ademand(rt, rt.lookup(self, rt.table_for(self),
                                                self.bound(args, kwargs), True))

    def map(self, iterable):
        """``[self(*a) for a in iterable]``, demanded at once (see ``incr.gather``): each item
        is a tuple of arguments, or a single argument that is not a tuple."""
        items = [a if type(a) is tuple else (a,) for a in iterable]
        return gather(*[_Bound(self, a) for a in items])

    def __reduce__(self):
        # sent to an executor's worker, a cell is a reference: calling it there reads the
        # value the driver gave for those arguments (incr.remote)
        from incr import remote as _remote
        return (_remote.CellRef, (self.name, _keys.cell_identity(self) or self.name,
                                  self.signature))

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __repr__(self):
        return f"<incr.cell {self.name}>"


class _Bound:
    __slots__ = ("cell", "args")

    def __init__(self, cell, args):
        self.cell = cell
        self.args = args

    def __call__(self):
        return self.cell(*self.args)


cdef str _label(Cell c, tuple args):
    return c.qualname_label + "(" + ", ".join([repr(a) for a in args]) + ")"


cdef object _fast_key(tuple args):
    # str, int and None stand for themselves in keys (bool and float are tagged by keys.py)
    cdef object a
    cdef type t
    for a in args:
        t = type(a)
        if t is not str and t is not int and a is not None:
            return None
    return args


cdef class Frame:
    """A running computation (internal). Built in Runtime.run without __init__."""


class Stabilization:
    """What one ``rt.stabilize()`` did: ``recomputed`` (labels of the instances that ran, in
    run order, cut off ones included), ``cutoff`` (those that ran to an equal value),
    ``loaded`` (taken from the store), ``reused`` (count verified without running),
    ``seconds`` and ``revision``. Labels are built when first read, not during the pass."""

    __slots__ = ("_log", "_labels", "reused", "seconds", "revision")

    def __init__(self, log, reused, seconds, revision):
        self._log = log            # (instance, action) in run order
        self._labels = None
        self.reused = reused
        self.seconds = seconds
        self.revision = revision

    def _of(self, want):
        if self._labels is None:
            self._labels = [((<Instance>n).label(), a) for n, a in self._log]
        return [lab for lab, a in self._labels if want(a)]

    @property
    def recomputed(self):
        return self._of(lambda a: a != A_LOADED)

    @property
    def cutoff(self):
        return self._of(lambda a: a == A_CUTOFF)

    @property
    def loaded(self):
        return self._of(lambda a: a == A_LOADED)

    def __repr__(self):
        return (f"Stabilization(revision={self.revision}, recomputed={self.recomputed!r}, "
                f"cutoff={self.cutoff!r}, loaded={self.loaded!r}, reused={self.reused}, "
                f"seconds={self.seconds:.6f})")


cdef class Observer:
    """Keeps one instance up to date across ``rt.stabilize()`` calls. Create with
    ``rt.observe(cell, *args)``."""

    def __init__(self, Runtime rt, Instance node):
        self.runtime = rt
        self.node = node
        self.callbacks = []
        self.active = True
        self.seen_at = -1
        self.error = None

    @property
    def value(self):
        """The instance's current value. If it is not up to date, this stabilizes first
        (``rt.stabilize()``: every observed instance, callbacks included); inside a running
        cell or a pass it demands the instance instead.

        Raises what the instance's run raised (also kept in ``error``), and IncrError if the
        observer was stopped.
        """
        if not self.active:
            raise IncrError(f"observer of {self.node.label()} was stopped")
        cdef Runtime rt = self.runtime
        cdef Instance n = self.node
        if _needs_work(n) and not rt.frames and not rt.stabilizing and not rt.busy_depth:
            try:
                rt.stabilize()
            except BaseException as e:
                if self.error is not None:
                    raise self.error
                if not isinstance(e, Exception) or _needs_work(n):
                    raise
                # another observed instance (or a callback) raised: this one is up to date
            if self.error is not None:
                raise self.error
            if not _needs_work(n):
                return n.value
        try:
            v = rt._demand_top(n)
        except Exception as e:
            self.error = e
            raise
        self.error = None
        return v

    @property
    def label(self):
        return self.node.label()

    def on_change(self, callback):
        """Call ``callback(value)`` after each stabilization that changed the value.

        Returns ``callback``, so this works as a decorator.
        """
        if not callable(callback):
            raise TypeError(f"on_change needs a callable, got {callback!r}")
        self.callbacks.append(callback)
        return callback

    def stop(self):
        """Stop observing; the instance is no longer refreshed by ``stabilize``. Idempotent."""
        if not self.active:
            return
        if self.runtime.other_busy():
            raise IncrError(self.runtime._other_thread())
        self.active = False
        obs = self.node.observed_by
        obs.remove(self)
        if not obs:
            self.node.observed_by = None

    def __repr__(self):
        state = "active" if self.active else "stopped"
        return f"<incr.Observer {self.node.label()} {state}>"


class _Batch:
    __slots__ = ("rt",)

    def __init__(self, rt):
        self.rt = rt

    def __enter__(self):
        self.rt._batch_enter()
        return self.rt

    def __exit__(self, *exc):
        self.rt._batch_exit()
        return False


_ACTIONS = {
    A_NONE: "none", A_COMPUTED: "computed", A_RECOMPUTED: "recomputed",
    A_CUTOFF: "cutoff", A_REUSED: "reused", A_FAILED: "failed", A_LOADED: "loaded",
}


cdef class Runtime:
    """An incremental runtime: its inputs, the trace of its instances and their memo.

    >>> import incr
    >>> rt = incr.Runtime()
    >>> x = rt.input("x", 2)
    >>> @incr.cell
    ... def square():
    ...     return x.get() ** 2
    >>> with rt:
    ...     square()
    4
    """

    def __init__(self, store=None, *, hash="xxh3_128", max_workers=None, max_bytes=None,
                 executor=None, max_concurrency=None, durability="group"):
        if durability not in ("group", "sync"):
            raise ValueError(f"Runtime: durability must be 'group' or 'sync', got "
                             f"{durability!r:.80}")
        if hash not in ("xxh3_128", "blake2b"):
            raise ValueError(f"Runtime: hash must be 'xxh3_128' or 'blake2b', got {hash!r}")
        if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes <= 0):
            raise ValueError(f"Runtime: max_bytes must be a positive int or None, got {max_bytes!r}")
        if max_workers is not None and (not isinstance(max_workers, int) or max_workers < 1):
            raise ValueError(f"Runtime: max_workers must be a positive int or None, got {max_workers!r}")
        if max_concurrency is not None and (not isinstance(max_concurrency, int)
                                            or max_concurrency < 1):
            raise ValueError(f"Runtime: max_concurrency must be a positive int or None, got "
                             f"{max_concurrency!r}")
        self.store_path = store
        self.hash = hash
        self.max_workers = max_workers
        self.max_concurrency = max_concurrency
        self.clock = 0
        self.revision = 0
        self.ts_clock = 0
        self.frame_ids = 0
        self.inputs = {}
        self.tables = {}
        self.frames = []
        self.dirty_observed = []
        self.unnotified = []
        self.quiet = -1
        self.busy_thread = 0
        self.busy_depth = 0
        self.forked_mid_run = None
        _runtimes.add(self)
        self.failed = {}
        self.report_log = None
        self.batch_depth = 0
        self.batch_bumped = False
        self.stabilizing = False
        self.closed = False
        self.store = None
        self.llm = None
        self.extensions = {}
        self.prefetch = None
        self.deferred = []
        self.inflight = {}
        self.awaiting = {}
        self.keep_failed = 0
        self.catching = 0
        self.pending_sets = []
        self.unwinding = []
        self.remote = None
        if executor is not None and not (callable(getattr(executor, "submit", None))
                                         and callable(getattr(executor, "results", None))):
            raise TypeError(f"Runtime: executor must have submit() and results() (see "
                            f"incr.adapters.dask and incr.adapters.ray), got {executor!r}")
        self.executor = executor
        if store is not None:
            self.store = Store(store, max_bytes=max_bytes, durability=durability)

    # -- the public surface ---------------------------------------------------------------

    def __enter__(self):
        self.check_usable()
        # the runtime active before, kept per context (each thread and asyncio task has its
        # own), so `with rt:` in several threads at once never mixes their stacks
        _outer.set(_outer.get() + (get_value(_active),))
        _active.set(self)
        return self

    def __exit__(self, *exc):
        cdef tuple outer = _outer.get()
        if not outer:
            raise IncrError("`with rt:` exited in another context than it was entered in")
        _active.set(outer[len(outer) - 1])
        _outer.set(outer[:len(outer) - 1])
        return False

    def input(self, str name, value=None):
        """Declare the input ``name`` with its first value. Names are unique within a runtime.

        Raises ValueError if ``name`` was declared before, TypeError if it is not a str.
        """
        self.check_usable()
        if name in self.inputs:
            raise ValueError(f"input {name!r} is already declared on this runtime")
        if not name:
            raise ValueError("an input needs a non-empty name")
        i = Input(self, name, value)
        self.inputs[name] = i
        return i

    def input_map(self, str name, mapping=None):
        """A keyed input (incr.collections.InputMap): ``set(key, value)``, ``delete(key)``,
        ``update(mapping)`` as one revision; operators ``map``, ``filter``, ``join``,
        ``group_by`` and folds propagate per key. Same as ``incr.input_map(rt, name, mapping)``.
        """
        from incr import collections as _collections
        return _collections.InputMap(self, name, mapping)

    def batch(self):
        """A context manager: every ``set`` inside it forms one revision.

        A batch is not a transaction: if its body raises, the sets made before the exception
        stay (as one revision).
        """
        self.check_usable()
        return _Batch(self)

    def _batch_enter(self):
        if self.frames:
            raise ReentrancyError(self._reentrancy("start a batch"))
        self.batch_depth += 1

    def _batch_exit(self):
        self.batch_depth -= 1
        if self.batch_depth == 0:
            self.batch_bumped = False

    def observe(self, cell, *args, **kwargs):
        """Observe one instance: ``stabilize()`` keeps it up to date and calls its callbacks.

        Registers and computes nothing: the next ``stabilize()`` computes every observed
        instance that is not up to date, independent ones concurrently (reading
        ``Observer.value`` first stabilizes). If its run raises, the instance is observed all
        the same: ``Observer.error`` holds the exception (``.value`` raises it), the next
        ``stabilize()`` runs it again, and the callbacks get its value once a run succeeds.
        Callbacks are called with every value the observer has not passed on yet, the first
        one included.
        """
        self.check_usable()
        if self.frames or self.stabilizing:
            raise ReentrancyError(self._reentrancy("observe an instance"))
        cdef Instance n = self._instance(cell, args, kwargs)
        if self.other_busy():
            raise IncrError(self._other_thread())
        o = Observer(self, n)
        if n.observed_by is None:
            n.observed_by = []
        n.observed_by.append(o)
        if _needs_work(n):
            self.dirty_observed.append(n)   # (I5) the next pass computes it
        else:
            self.unnotified.append(o)       # up to date already: the next pass passes it on
        return o

    def stabilize(self):
        """Bring every observed instance up to date in one pass, then call the callbacks of
        those whose value changed.

        Each stale instance runs at most once, dependencies before dependents, so none sees a
        mix of old and new values. Runtime complexity: O(instances made stale since the last
        stabilization).

        Raises the first exception an observed instance raised (after the others were brought
        up to date and the callbacks of those that succeeded were called; each observer of a
        failed instance keeps its exception in ``Observer.error``). Every callback runs even
        if one raises; their exceptions are raised together afterwards as an ExceptionGroup
        (with the instance's exception first, if there was one). Interrupted (Ctrl-C), it
        leaves every observed instance up to date or queued, and the callbacks it did not call
        to the next pass. From a thread other than the one computing: IncrError.
        """
        self.check_usable()
        if self.frames or self.stabilizing:
            raise ReentrancyError(self._reentrancy("stabilize"))
        if _async_defined and not _loop_running() and not self.busy_depth:
            # async cells or calls may need to run: on this thread's event loop, concurrently
            return _aio_mod().drive(_aio_mod().astabilize(self))
        self.enter()
        try:
            return self.stabilize_pass()
        except _Suspend as s:
            if self.catching:
                raise
            _aio_mod().abandon(self, s.works)
            raise IncrError(_SUSPEND_MSG.format(what="an observed instance")) from None
        finally:
            self.leave()

    cdef object stabilize_pass(self):
        cdef list todo = []
        cdef Instance n
        cdef Observer o
        cdef bint done = False
        t0 = time.perf_counter()
        for n in dict.fromkeys(self.dirty_observed):  # once each, in the order queued
            if n.observed_by is not None:
                todo.append(n)
        self.dirty_observed = []
        todo.sort(key=_ts_key)
        errors = []
        log = []
        reused0 = self.n_reused
        token = _active.set(self)
        self.stabilizing = True
        self.report_log = log
        if not self.keep_failed:
            self.failed.clear()
        cdef list suspended = None   # async work met by this pass (created when met)
        cdef int rejects = 0
        cdef int rounds = 0
        if (_run_ahead and self.max_workers != 1) or self.executor is not None:
            from incr import remote as _remote
            self.prefetch = _remote.Ahead(self)
        self.deferred = []
        try:
            while True:
                deferred = False
                for n in todo:
                    if n.flags & F_DEFERRED:
                        deferred = True     # set aside earlier in this pass
                    elif not (n.flags & F_HAS_VALUE) and n in self.failed:
                        errors.append((n, self.failed[n]))  # failed earlier in this pass
                    elif _needs_work(n):
                        try:
                            self.ensure(n)
                        except _Suspend as s:
                            if suspended is None:      # async work: gathered, done at once
                                suspended = []
                            suspended.extend(s.works)
                        except _Deferred:
                            deferred = True
                        except Exception as e:
                            errors.append((n, e))
                if suspended:
                    # inside a running event loop, observed instances need async work: the
                    # pass stops here (nothing half-recorded) and rt.astabilize does the work
                    # of all of them concurrently, then passes again (incr._aio)
                    s = _Suspend(suspended)
                    suspended = None
                    raise s
                if self.deferred:
                    deferred = True
                    for n in self.deferred:
                        n.flags &= ~F_DEFERRED
                    self.deferred = []
                if deferred:
                    # generator calls and executor runs set aside in this pass run now,
                    # concurrently; then the pass runs again and takes their results
                    # (replaying what they read)
                    rounds += 1
                    if not self.prefetch.run() or rounds > 32:
                        self.prefetch.stop()  # nothing to run ahead: the next pass is serial
                    errors = []
                    self.failed.clear()
                    todo = [n for n in dict.fromkeys(todo + self.dirty_observed)
                            if n.observed_by is not None]
                    self.dirty_observed = []
                    todo.sort(key=_ts_key)
                    continue
                # an incr.Reject withdraws the candidate it blames (its dependents become
                # stale through the usual propagation); the pass then runs again
                again = False
                for n, e in errors:
                    if isinstance(e, Reject) and rejects < MAX_REJECTS and self.absorb_reject(e):
                        rejects += 1
                        again = True
                        break
                if not again:
                    break
                errors = []
                self.failed.clear()
                todo = [n for n in dict.fromkeys(todo + self.dirty_observed)
                        if n.observed_by is not None]
                self.dirty_observed = []
                todo.sort(key=_ts_key)
            done = True
        except BaseException as e:
            if suspended:
                # interrupted with async work started for this pass: nobody will finish it
                _aio_mod().abandon(self, suspended)
            raise
        finally:
            self.stabilizing = False
            self.prefetch = None
            self.report_log = None
            for n in self.deferred:
                n.flags &= ~F_DEFERRED
            self.deferred = []
            for n in todo:       # (I5) one not up to date (still stale, failed, interrupted)
                if n.observed_by is not None and _needs_work(n):   # waits for the next pass
                    self.dirty_observed.append(n)
            if not done:
                # interrupted (Ctrl-C, any exception): the callbacks of what was brought up to
                # date are owed to the next pass
                self.owe(todo)
            _active.reset(token)
            if self.store is not None:
                try:
                    self.flush(bool(errors))
                except BaseException:
                    if done:   # the pass is done but its callbacks will not run now
                        self.owe(todo)
                    raise
        failed = {}
        for n, e in errors:
            failed.setdefault(n, e)
        # callbacks run once everything is up to date, outside the trace: every one of them,
        # even if one raises; an interrupt keeps the rest for the next pass
        due = self.unnotified
        self.unnotified = []
        for n in todo:
            if n.observed_by is None:
                continue
            e = failed.get(n)
            for o in n.observed_by:
                if e is not None:
                    o.error = e
                elif n.flags & F_HAS_VALUE:
                    o.error = None
                    if o.seen_at != n.changed_at:
                        due.append(o)
        cb_errors = _notify(due, self)
        report = Stabilization(log, self.n_reused - reused0, time.perf_counter() - t0,
                               self.revision)
        if errors:
            n, e = errors[0]
            _add_note(e, f"incr: raised while stabilizing the observed instance {n.label()}")
            for n2, e2 in errors[1:]:
                if e2 is not e:
                    _add_note(e, f"incr: {(<Instance>n2).label()} also raised "
                                 f"{type(e2).__name__}: {e2}")
            if cb_errors:
                raise _group("incr: stabilize raised, and so did on_change callbacks",
                             [e] + cb_errors)
            raise e
        if cb_errors:
            raise _group(f"incr: {len(cb_errors)} on_change callback(s) raised", cb_errors)
        return report

    def explain(self, cell, *args, **kwargs):
        """Say why the instance's current value was computed, reused or cut off: which
        dependency changed, at which revision. Does not compute anything."""
        self.check_usable()
        cdef Instance n = self._instance(cell, args, kwargs, create=False)
        if n is None:
            return (f"{_label(<Cell>cell, (<Cell>cell).bound(args, kwargs))} has never been "
                    f"computed on this runtime")
        return _explain(self, n)

    def stats(self):
        """Cumulative counters since the runtime was created."""
        return {
            "revision": self.revision,
            "inputs": len(self.inputs),
            "instances": sum(len(t) for t in self.tables.values()),
            "computed": self.n_computed,
            "recomputed": self.n_recomputed,
            "reused": self.n_reused,
            "cutoff": self.n_cutoff,
            "failed": self.n_failed,
            "store_hits": self.n_store_hits,
            "store_misses": self.n_store_misses,
            "generations": 0 if self.llm is None else self.llm.generations,
            "validations": 0 if self.llm is None else self.llm.validations,
        }

    # -- LLM nodes (incr.llm does the work) --------------------------------------------------

    def state(self, node, *args, **kwargs):
        """The state of one LLM node instance: an incr.NodeState (candidate, revision,
        context_key, dependency_revisions, checks, status)."""
        self.check_usable()
        from incr import llmnodes as _llm
        if (self.other_busy() and self.owner != PyThread_get_thread_ident()
                and not (self.prefetch is not None and self.prefetch.is_worker())):
            # another thread's pass (a generator or validator of that pass may read it)
            raise IncrError(self._other_thread())
        return _llm.state(self, node, args, kwargs)

    def nack(self, node, *args, revision, case, counterexample=None, message="", **kwargs):
        """Record a NACK for candidate ``revision`` of node(*args). For the current revision
        the node is withdrawn at once (its readers become stale) and generates again, with
        the counterexample as feedback, at its next demand; for another revision it is
        history (and its counterexample a regression case)."""
        self.check_usable()
        from incr import llmnodes as _llm
        self.enter()   # one thread at a time: another thread's pass gets IncrError
        try:
            _llm.outside_verdict(self, node, args, kwargs,
                                 _llm.NACK(case, counterexample, message), revision, "nack")
        finally:
            self.leave()

    def ack(self, node, *args, revision, case, evidence=None, **kwargs):
        """Record an ACK for candidate ``revision`` of node(*args) (see nack)."""
        self.check_usable()
        from incr import llmnodes as _llm
        self.enter()
        try:
            _llm.outside_verdict(self, node, args, kwargs, _llm.ACK(case, evidence), revision,
                                 "ack")
        finally:
            self.leave()

    def halt(self, reason):
        """Stop every LLM loop on this runtime before its next model (generator) call, with
        incr.NotAccepted(reason="halted") whose report names ``reason`` (a non-empty str).
        Nothing partial is recorded. Only sets a flag: callable from any thread or a signal
        handler. Lasts until rt.resume()."""
        from incr import llmnodes as _llm
        _llm.halt(self, reason)

    def resume(self):
        """Allow model calls again after rt.halt(); the halted demands can simply be repeated."""
        from incr import llmnodes as _llm
        _llm.resume(self)

    @property
    def halted(self):
        """The reason given to rt.halt() while halted, else None."""
        return self.halt_reason

    def astabilize(self):
        """``await rt.astabilize()``: ``stabilize()`` from async code (inside a running event
        loop). The async work of every observed instance (async cells, async generator and
        validator calls) runs concurrently as tasks on the running loop; sync generator calls
        run in threads as in ``stabilize()``. Same report, same errors."""
        self.check_usable()
        return _aio_mod().astabilize(self)

    async def aclose(self):
        """``await rt.aclose()``: ``close()`` from async code."""
        self.close()

    def close(self):
        """Flush and close the store, and close the runtime. Using it afterwards raises
        IncrError. Idempotent."""
        if self.closed:
            return
        if self.frames or self.stabilizing or self.busy_depth:
            if self.other_busy():
                raise IncrError(f"cannot close this incr.Runtime while another thread computes "
                                f"on it; close it from that thread, or once it has finished")
            raise ReentrancyError(self._reentrancy("close the runtime"))
        self.closed = True
        if self.store is not None:
            try:
                self.store.commit()
            finally:
                self.store.close()

    def __reduce__(self):
        raise TypeError("an incr.Runtime cannot be pickled or sent to another process; "
                        "cells and inputs travel as references (see incr.remote)")

    def __repr__(self):
        return (f"<incr.Runtime revision={self.revision} inputs={len(self.inputs)} "
                f"instances={sum(len(t) for t in self.tables.values())}>")

    # -- helpers for the Python layer -----------------------------------------------------

    def _demand_top(self, Instance n):
        """Demand ``n`` from outside any cell, with this runtime active."""
        self.check_usable()
        if get_value(_active) is self:
            return self.demand(n)
        token = _active.set(self)
        try:
            return self.demand(n)
        finally:
            _active.reset(token)

    def _instance(self, cell, tuple args, dict kwargs, bint create=True):
        if not isinstance(cell, Cell):
            raise TypeError(f"expected an incr cell, got {cell!r}")
        cdef Cell c = <Cell>cell
        return self.lookup(c, self.table_for(c), c.bound(args, kwargs), create)

    def _instances(self):
        """Every instance of the trace (for tests and tools)."""
        out = []
        for t in self.tables.values():
            out.extend(t.values())
        return out

    def _check(self):
        """Verify the trace's invariants (I1–I7 in _core.pxd). For tests: O(trace)."""
        cdef Instance n
        cdef Node d
        from collections import Counter
        problems = []
        if self.frames:
            problems.append("I6: frames left on the stack")
        if self.deferred and not self.stabilizing:
            problems.append("I6: instances left set aside after stabilize")
        dependents_of = {}
        all_nodes = list(self.inputs.values()) + self._instances()
        dirty_obs = {id(x) for x in self.dirty_observed}
        for node in all_nodes:
            if isinstance(node, Instance):
                n = node
                lab = n.label()
                if n.flags & (F_RUNNING | F_VERIFYING):
                    problems.append(f"I6: {lab} is marked running or verifying")
                if n.flags & F_DEFERRED and not self.stabilizing:
                    problems.append(f"I6: {lab} is still marked set aside (F_DEFERRED)")
                for d in n.deps:
                    dependents_of.setdefault(id(d), Counter())[id(n)] += 1
                    if (n.flags & (F_DIRTY | F_HAS_VALUE)) == F_HAS_VALUE and (d.flags & F_DIRTY):
                        problems.append(f"I1: {lab} is not dirty but its dependency "
                                        f"{_node_label(d)} is")
                    if not _needs_work(n) and d.changed_at > n.verified_at:
                        problems.append(f"I2: {lab} is clean but {_node_label(d)} changed at "
                                        f"{d.changed_at} after its verification {n.verified_at}")
                    if d.ts >= n.ts:
                        problems.append(f"I4: {lab} (ts {n.ts}) reads {_node_label(d)} "
                                        f"(ts {d.ts})")
                if n.observed_by is not None and _needs_work(n) and id(n) not in dirty_obs:
                    problems.append(f"I5: observed {lab} is dirty or failed but not queued")
                if (n.flags & F_HAS_VALUE) == 0 and n.value is not None:
                    problems.append(f"{lab} keeps a value from a failed run")
                if n.cell.is_llm and not _needs_work(n) and self.llm is not None:
                    problems.extend(_stale_evidence(self, n))
        for node in all_nodes:
            got = Counter(id(x) for x in ((<Node>node).dependents or ()))
            want = dependents_of.get(id(node), Counter())
            if got != want:
                problems.append(f"I3: dependents of {_node_label(node)} do not mirror deps")
        if problems:
            raise AssertionError("trace invariants broken:\n  " + "\n  ".join(problems))
        return True

    def _other_thread(self):
        return ("this incr.Runtime is computing in another thread; a runtime is used by one "
                "thread at a time (give each thread its own runtime, or wait for it)")

    def _reentrancy(self, what):
        if self.frames and PyThread_get_thread_ident() != self.owner:
            return self._other_thread()
        if self.frames:
            return (f"cannot {what} from inside the running cell "
                    f"{(<Frame>self.frames[-1]).node.label()}; changes happen between "
                    f"computations, not during them")
        return f"cannot {what} while the runtime is stabilizing"

    # -- hooks for incr.llm (internal) -----------------------------------------------------

    def _running(self):
        """The instance whose function runs now (innermost), or None."""
        if not self.frames:
            return None
        return (<Frame>self.frames[len(self.frames) - 1]).node

    def _reads(self):
        """The live list of nodes the running instance has read so far."""
        return (<Frame>self.frames[len(self.frames) - 1]).reads

    def _read(self, Node node):
        """Read ``node`` from the running instance: records the dependency, brings it up to
        date, returns its value (raises what it raises)."""
        if isinstance(node, Input):
            return (<Input>node).get()
        return self.demand(<Instance>node)

    def _invalidate(self, Instance n, bint check=False):
        """Withdraw n's value (a NACK on it): n runs again at its next demand, never from
        the store, and everything that read it is stale, as after an input change. With
        check=True, only raise what withdrawing now would raise (ReentrancyError inside a
        computation), so that a caller can refuse before it changes anything."""
        self.check_usable()
        if self.frames or self.stabilizing:
            raise ReentrancyError(self._reentrancy(f"withdraw {n.label()}"))
        if not check:
            self.invalidate(n)

    cdef bint elsewhere(self, Node n):
        # n is an async instance whose run is in flight in another task (not on this stack)
        cdef object f
        if not (n.flags & F_RUNNING) or n not in self.inflight:
            return False
        for f in self.frames:
            if (<Frame>f).node is n:
                return False
        return True

    # -- hooks of incr._aio (async cells and calls; the loop's thread only) ------------------

    def _frames_swap(self, list frames):
        """Make ``frames`` the running stack (one asyncio task's); returns the previous one."""
        old = self.frames
        self.frames = frames
        return old

    def _frames(self):
        return self.frames

    def _run_start(self, Instance n):
        """Push n's frame on the running stack; returns (frame, had a value, was withdrawn)."""
        cdef int invalid = n.flags & F_INVALID
        cdef bint had = (n.flags & F_HAS_VALUE) != 0
        return self.run_begin(n), had, invalid, self.clock

    def _invoke(self, Instance n):
        return n.cell.invoke(_keys.own_args(n.args) if n.fresh_args else n.args)

    def _run_finish(self, Instance n, Frame f, bint had, value, long long start):
        cdef Node d
        self.frames.pop()
        self.run_end(n, f, had, value)
        for d in n.deps:
            if d.changed_at > start:
                # it changed while this run was suspended (another task set it): the run
                # may have read both values, so its result is stale at once (I1, I2)
                n.flags |= F_DIRTY
                n.verified_at = start
                self.dirty_from(n)
                if n.observed_by is not None:
                    self.dirty_observed.append(n)
                break

    def _run_failed(self, Instance n, Frame f, bint had, int invalid, BaseException e):
        self.frames.pop()
        self.fail(n, f.reads, had, e, "raised in cell")
        if isinstance(e, (_Suspend, _CancelledError)):
            n.flags |= invalid      # unwound: still withdrawn if it was

    def _pseudo_frame(self, Instance n):
        """A frame that records the reads of a call made for n (an async generator's or
        validator's), not pushed anywhere."""
        return self.new_frame(n)

    def _frame_info(self, Frame f):
        return f.node, f.reads

    def _enter(self):
        """Claim the runtime for this thread for an async operation (incr._aio)."""
        self.enter()

    def _leave(self):
        self.leave()

    def _quiet_swap(self, long long q):
        """Make ``q`` the untracked frame id (a task's own); returns the previous one."""
        cdef long long old = self.quiet
        self.quiet = q
        return old

    def _report_into(self, log):
        """Log the runs made from now on into ``log`` (a list), or stop (None): the report of
        rt.astabilize includes the runs its async work made between passes."""
        self.report_log = log

    def _keep_failed(self, int step):
        if step > 0 and self.keep_failed == 0:
            self.failed.clear()     # a new top-level async operation
        self.keep_failed += step

    def _demand(self, Instance n):
        return self.demand(n)

    def _has(self, Node n):
        return not _needs_work(n)

    def _gathering(self, int step):
        self.gathering += step

    def _lend(self, unsigned long ident):
        """Let thread ``ident`` compute for the running frame while its owner waits
        (validators with a timeout). Returns the previous owner, to give back."""
        cdef unsigned long old = self.owner
        self.owner = ident
        return old

    def _ikey(self, Instance n):
        """n's instance key in the store, or None (no store, or it cannot be stored)."""
        if self.store is None:
            return None
        cdef Persist p = n.persist
        if p is None:
            p = self.persist_of(n)
        return p.ikey if p.ok else None

    def _refs(self, nodes):
        """Store references [kind, ref, value hash] naming ``nodes``, or None if one cannot
        be named or hashed."""
        return self.refs(nodes)

    def _resolve_ref(self, ref):
        """The node a stored reference names in this process (computing nothing), or None."""
        cdef Cell c
        if type(ref) is not list or len(ref) != 3:
            return None
        if ref[0] == "i" and type(ref[1]) is str:
            return self.inputs.get(ref[1])
        if ref[0] != "c" or type(ref[1]) is not list or len(ref[1]) != 2:
            return None
        ident, args_b = ref[1]
        if type(ident) is not str or type(args_b) is not bytes:
            return None
        co = _keys.stored_cell(ident)
        if co is None:
            return None
        c = <Cell>co
        args = _stored_args(self, args_b)
        if args is None:
            return None
        try:
            return self.lookup(c, self.table_for(c), args, True)
        except TypeError:
            return None

    def _vhash(self, Node n):
        """n's content hash (b"" if it cannot be encoded)."""
        return self.value_hash(n)

    def _commit(self):
        """Commit what the store has buffered, durably whatever the durability (no-op in
        memory)."""
        if self.store is not None and not self.frames and not self.stabilizing:
            self.store.commit()

    def _store_node(self, bytes ikey):
        return self.store.node(ikey)

    def _store_put_node(self, bytes ikey, bytes record):
        self.store.put_node(ikey, record)

    def _hash_value(self, value):
        """The content hash a value would have here (b"" if it cannot be encoded)."""
        try:
            return _keys.digest("value", _keys.encode_value(value), self.hash)
        except TypeError:
            return b""

    def _input(self, str name):
        """The input declared as ``name``, or None."""
        return self.inputs.get(name)

    def _dep_info(self, Instance n):
        """(label, revision of its last change, content hash or None) per dependency of n."""
        out = []
        cdef Node d
        for d in n.deps:
            h = self.value_hash(d) if d.flags & F_HAS_VALUE else b""
            out.append((_node_label(d), d.changed_rev, h or None))
        return out

    # -- the engine -------------------------------------------------------------------------

    cdef void invalidate(self, Instance n) except *:
        self.clock += 1
        if self.batch_depth == 0:
            self.revision += 1
        elif not self.batch_bumped:
            self.revision += 1
            self.batch_bumped = True
        if n.flags & F_HAS_VALUE:
            n.flags |= F_INVALID
            n.why = n                     # explain: withdrawn by evidence
            if not (n.flags & F_DIRTY):
                n.flags |= F_DIRTY
                if n.observed_by is not None:
                    self.dirty_observed.append(n)
        self.dirty_from(n)

    cdef bint absorb_reject(self, BaseException e) except -1:
        # an incr.Reject reached the top: record its NACK and withdraw the blamed candidate
        # (incr.llm decides whether it applies); True when the computation should run again
        from incr import llmnodes as _llm
        inst = _llm._absorb_reject(self, e)
        if inst is None:
            return False
        self.invalidate(<Instance>inst)
        self.failed.clear()
        return True


    cdef void check_usable(self) except *:
        if self.closed:
            if self.forked_mid_run is not None:
                raise IncrError(self.forked_mid_run)
            raise IncrError("this incr.Runtime is closed; create a new one")

    cdef void owe(self, list todo):
        # after an interrupted pass: the observers of what was brought up to date get their
        # callbacks from the next pass (what still needs work is queued by the pass itself)
        cdef Instance n
        cdef Observer o
        for n in todo:
            if n.observed_by is not None and not _needs_work(n):
                for o in n.observed_by:
                    if o.seen_at != n.changed_at:
                        self.unnotified.append(o)

    cdef long long quiet_enter(self):
        # reads of the innermost running frame stop being recorded; returns what to restore
        cdef long long old = self.quiet
        if self.frames and self.owner == PyThread_get_thread_ident():
            # (only the thread computing here: in any other thread it changes nothing)
            self.quiet = (<Frame>self.frames[len(self.frames) - 1]).id
        return old

    cdef inline bint other_busy(self):
        # another thread is in a top-level demand or stabilize of this runtime
        return self.busy_depth and self.busy_thread != PyThread_get_thread_ident()

    cdef void enter(self) except *:
        # a top-level demand or stabilize begins: one thread at a time. Check and claim run
        # with no Python call in between, so under the GIL no other thread slips in.
        if self.other_busy():
            raise IncrError(self._other_thread())
        if self.closed:
            self.check_usable()
        self.busy_thread = PyThread_get_thread_ident()
        self.busy_depth += 1

    cdef void leave(self):
        if self.pending_sets and self.busy_depth == 1:
            self.apply_pending()
        self.busy_depth -= 1
        if self.busy_depth == 0:
            self.busy_thread = 0

    cdef void apply_pending(self):
        # changes other threads made during the pass: the next revision, applied in the order
        # they were made, before another thread may claim the runtime
        cdef Input inp
        while self.pending_sets and not self.closed:
            inp, value = self.pending_sets.pop(0)
            try:
                self.apply_set(inp, value)
            except Exception as e:   # only a raising __eq__ of the value gets here
                _warnings.warn(f"incr: input {inp.name!r} could not be set after the pass "
                               f"({e!r}); set it again", RuntimeWarning)

    cdef Instance lookup(self, Cell c, dict table, tuple bound, bint create):
        # the instance of c for these bound arguments (created if asked), or None.
        # TypeError, naming the cell and the argument, if an argument cannot be keyed.
        cdef object owned = None
        key = _fast_key(bound)
        cdef bint fast = key is not None
        if not fast:
            key = normalize_args(c.qualname_label, c.param_names, bound)
        n = table.get(key)
        if n is None and create:
            self.check_usable()
            if not fast:    # (str, int and None need no copy)
                owned = _keys.own_args(bound)   # the instance never shares the caller's objects
            if owned is None:
                n = Instance(c, bound, self)
            else:
                n = Instance(c, <tuple>owned, self)
                (<Instance>n).fresh_args = True
            table[key] = n
        return n

    cdef dict table_for(self, Cell cell):
        cdef dict t = self.tables.get(cell)
        if t is None:
            t = {}
            self.tables[cell] = t
        return t

    cdef void record_read(self, Node n):
        cdef Frame f = <Frame>self.frames[len(self.frames) - 1]
        if n.read_stamp != f.id and f.id != self.quiet:
            n.read_stamp = f.id
            f.reads.append(n)

    cdef void record_into(self, Frame f, Node n):
        if n.read_stamp != f.id:
            n.read_stamp = f.id
            f.reads.append(n)

    cdef object demand(self, Instance n):
        cdef Py_ssize_t i
        if self.prefetch is not None and self.prefetch.reading and self.prefetch.is_worker():
            # a generator running ahead in a worker thread (stabilize with max_workers, or an
            # incr.gather): it may read what is up to date; anything else waits for the pass
            if (n.flags & (F_DIRTY | F_HAS_VALUE | F_RUNNING | F_VERIFYING)) == F_HAS_VALUE:
                self.prefetch.read(n)
                return n.value
            raise _Deferred(n.label())
        elif self.frames:
            if PyThread_get_thread_ident() != self.owner:
                raise IncrError(self._other_thread())
            if not (n.flags & (F_RUNNING | F_VERIFYING)):
                self.record_read(n)  # (an edge into a cycle is never recorded)
        elif self.other_busy():
            raise IncrError(self._other_thread())   # another thread's demand or stabilize
        elif not self.stabilizing:
            if self.closed:
                self.check_usable()
            if self.failed and not self.keep_failed:
                self.failed.clear()  # a new top-level pass: failed instances run again
        if (n.flags & (F_DIRTY | F_HAS_VALUE | F_RUNNING | F_VERIFYING)) == F_HAS_VALUE:
            return n.value
        if n.flags & (F_RUNNING | F_VERIFYING):
            if self.inflight and self.elsewhere(n):
                raise _Suspend([_aio_mod().Wait(n)])   # another task runs it: wait for it
            labels = [(<Frame>f).node.label() for f in self.frames]
            start = 0
            for i in range(len(self.frames)):
                if (<Frame>self.frames[i]).node is n:
                    start = i
                    break
            raise CycleError(labels[start:] + [n.label()] if n.flags & F_RUNNING
                             else [n.label()] + labels[start:] + [n.label()])
        if not (n.flags & F_HAS_VALUE) and n in self.failed:
            raise self.failed[n]
        if self.frames or self.stabilizing:
            return self.ensure(n)
        cdef bint in_loop = _async_defined and _loop_running()
        self.enter()
        if in_loop:
            _aio_mod()._op_began()   # sync code on a running loop: a sync cell's calls of async
                                     # cells return values here (not awaitables)
        try:
            return self.settle(n, None)
        except _Suspend as s:
            if self.catching:
                raise
            _aio_mod().abandon(self, s.works)
            raise IncrError(_SUSPEND_MSG.format(what=n.label())) from None
        finally:
            if in_loop:
                _aio_mod()._op_ended()
            self.leave()

    cdef object settle(self, Instance n, object body):
        # A top-level demand of n, or body() (incr.gather at top level): one store commit for
        # everything it computed; an incr.Reject that escapes withdraws the blamed candidate
        # and it runs again.
        cdef int rejects = 0
        while True:
            try:
                v = self.ensure(n) if body is None else body()
                break
            except Reject as e:
                if rejects < MAX_REJECTS and self.absorb_reject(e):
                    rejects += 1
                    continue
                if self.store is not None:
                    self.flush(True)
                raise
            except BaseException:
                if self.store is not None:
                    self.flush(True)   # what finished is kept (a _Suspend: the rest runs again)
                raise
        if self.store is not None:
            self.flush(False)
        return v

    # -- incr.gather's own rounds (no pass is gathering work already) ------------------------

    def _ahead_begin(self):
        """Start gathering work to run ahead for an incr.gather; False if a pass already
        does (stabilize), or there is nothing that could run ahead."""
        if self.prefetch is not None:
            return False
        if not ((_run_ahead and self.max_workers != 1) or self.executor is not None):
            return False
        from incr import remote as _remote
        self.prefetch = _remote.Ahead(self)
        self.deferred = []
        return True

    def _ahead_round(self, int rounds):
        """Run what was set aside, concurrently; the gather then calls its thunks again."""
        cdef Instance m
        for m in self.deferred:
            m.flags &= ~F_DEFERRED
        self.deferred = []
        if not self.prefetch.run() or rounds > 32:
            self.prefetch.stop()      # nothing to run ahead: the next round is serial

    def _ahead_end(self):
        cdef Instance m
        self.prefetch = None
        for m in self.deferred:
            m.flags &= ~F_DEFERRED
        self.deferred = []

    cdef object ensure(self, Instance n):
        # Bring n up to date. Recorded dependencies are walked with an explicit stack, so the
        # depth of the graph never becomes depth of the C or Python stack.
        cdef list stack = [n]
        cdef list idx = [0]
        cdef Instance m
        cdef Node d
        cdef tuple deps
        cdef Py_ssize_t i, nd
        cdef bint pushed, must_run
        if n.flags & F_DEFERRED:
            raise _Deferred(n.label())    # set aside in this pass: whatever reads it waits
        n.flags |= F_VERIFYING
        try:
            while stack:
                m = <Instance>stack[len(stack) - 1]
                if m.persist is not None and m.persist.cands is not None:
                    # a store lookup in progress: a dependency it pushed is now up to date
                    if self.attempt(m, stack, idx) == PUSHED:
                        continue
                elif not _needs_work(m):
                    pass
                elif not (m.flags & F_HAS_VALUE):
                    if self.attempt(m, stack, idx) == PUSHED:
                        continue
                else:
                    i = <Py_ssize_t>idx[len(idx) - 1]
                    deps = m.deps
                    nd = len(deps)
                    pushed = False
                    must_run = (m.flags & (F_MUST_RUN | F_INVALID)) != 0
                    while i < nd:
                        d = <Node>deps[i]
                        if d.flags & F_DEFERRED:
                            # its run is set aside for this pass: m waits for the next one.
                            # With an executor the scan goes on (independent work is shipped
                            # together); without one it stops here, in Salsa's order: d's new
                            # value may take m's new run away from the dependencies after it
                            m.flags |= F_DEFERRED
                            if self.executor is None:
                                break
                            i += 1
                            continue
                        if (d.flags & (F_DIRTY | F_HAS_VALUE)) == (F_DIRTY | F_HAS_VALUE):
                            if self.inflight and self.elsewhere(d):
                                raise _Suspend([_aio_mod().Wait(d)])   # another task runs it
                            if d.flags & (F_VERIFYING | F_RUNNING):
                                raise CycleError([m.label(), _node_label(d), m.label()])
                            idx[len(idx) - 1] = i
                            d.flags |= F_VERIFYING
                            stack.append(d)
                            idx.append(0)
                            pushed = True
                            break
                        if not must_run and (not (d.flags & F_HAS_VALUE)
                                             or d.changed_at > m.verified_at):
                            # d failed last time, or changed: m must run
                            must_run = True
                            m.why = d
                            if len(self.frames) < DEEP and self.executor is None:
                                break
                            # (with an executor, every stale dependency is brought up to date
                            # here first, so that independent ones are shipped together; a
                            # run that starts now would compute them nested, in the driver)
                            # Deep inside nested runs: bring m's other dirty dependencies up
                            # to date here, on this explicit stack, before m runs and reads
                            # them, so that depth of the graph never becomes depth of the
                            # Python stack. (Shallow runs keep Salsa's order: a branch the new
                            # run no longer takes is never touched.)
                            m.flags |= F_MUST_RUN
                        i += 1
                    if pushed:
                        continue
                    if m.flags & F_DEFERRED:
                        self.deferred.append(m)   # waits: neither run nor verified now
                    elif must_run:
                        m.flags &= ~F_MUST_RUN
                        if self.attempt(m, stack, idx) == PUSHED:
                            continue
                    else:
                        m.flags &= ~F_DIRTY
                        m.verified_at = self.clock
                        m.last_action = A_REUSED
                        self.n_reused += 1
                m.flags &= ~F_VERIFYING
                stack.pop()
                idx.pop()
        except BaseException:
            for m in stack:
                m.flags &= ~(F_VERIFYING | F_MUST_RUN)
                if m.persist is not None:
                    m.persist.cands = None
                    m.persist.resolved = None
            raise
        if n.flags & F_DEFERRED:
            raise _Deferred(n.label())    # it waits: its old value is not the answer
        return n.value

    cdef int attempt(self, Instance m, list stack, list idx) except -1:
        # m must be (re)computed: take it from the store if a stored trace of it matches the
        # current dependencies, else run it. Returns PUSHED when a dependency was pushed.
        cdef int r
        cdef int invalid = m.flags & F_INVALID
        cdef Node d
        if self.store is not None and not (m.flags & F_INVALID):
            r = self.probe_step(m, stack, idx)
            if r != NOMATCH:
                return r
        if self.prefetch is not None and self.executor is not None and not m.cell.local \
                and (not self.frames or self.gathering):
            # an executor runs it: with its result (reads replayed in run), or set aside now.
            # What its new branch read beyond its last run's dependencies (the scan of m.deps
            # does not see it) is brought up to date first, as a local run would read it
            for d in self.prefetch.extra.get(m, ()):
                if d.flags & F_DEFERRED:
                    m.flags |= F_DEFERRED         # set aside in this pass: m waits with it
                    self.deferred.append(m)
                    return DONE
                if not isinstance(d, Instance) or not _needs_work(d):
                    continue
                if d.flags & (F_VERIFYING | F_RUNNING) or (
                        not (d.flags & F_HAS_VALUE) and d in self.failed):
                    # it failed in this pass, or m's new branch reads what is being verified
                    # now: m runs here, and meets that where it reads it, as a local run would
                    self.prefetch.local.add(m)
                    break
                m.flags |= F_MUST_RUN             # back on top of the stack, m runs
                d.flags |= F_VERIFYING
                stack.append(d)
                idx.append(0)
                return PUSHED
            r = self.prefetch.ship(m)
            if r == 0:
                m.flags |= F_DEFERRED
                self.deferred.append(m)
                return DONE
            if r == 2:
                # it read something it was not given: that is among its extra dependencies
                # now (or m runs here), and the run is sent again once it is up to date
                self.prefetch.missing_node(m)
                return self.attempt(m, stack, idx)
            if r == 1:
                self.remote = m
        try:
            self.run_in_stack(m, len(stack) == 1)
        except _Deferred:
            # its run was set aside (fail() keeps its value and stamps): a withdrawn instance
            # stays withdrawn, so that the next pass runs it instead of reusing that value
            m.flags |= invalid
            raise
        finally:
            self.remote = None
        return DONE

    cdef int probe_step(self, Instance m, list stack, list idx) except -1:
        # Find m's stored trace that matches its current dependencies by walking the store's
        # index (incr/store.py): from the root node of m's instance key, each node names the
        # next dependency the traces through it read; that dependency is brought up to date
        # (a cell is pushed on the explicit stack, so a warm start never recurses) and its
        # value hash chooses the next node, until a node names the entry. The cost depends on
        # the dependencies read, not on how many traces are stored. The entry's record is then
        # checked against what was walked (the index is only a guide: never trusted for a
        # value), and adopted.
        cdef Persist p = m.persist
        cdef Node d
        cdef Record rec
        cdef bytes v
        cdef Py_ssize_t i
        if p is None:
            p = self.persist_of(m)
        if not p.ok:
            return NOMATCH
        if p.cands is None:
            p.cands = []           # (not None: a lookup runs)
            p.node = _INDEX_ROOT
            p.di = 0
            p.resolved = []
        while p.node is not None:
            if len(p.resolved) > p.di:
                d = <Node>p.resolved[p.di]   # pushed for verification; back now
            else:
                try:
                    v = self.index_node(p.ikey + p.node)
                    if v is None:
                        return self.no_match(p)
                    x = self.index_choose(p.ikey, v)
                    if isinstance(x, Record):    # every dependency matched: the entry
                        p.cands.append(x)
                        p.node = None
                        break
                    d = <Node>x
                except ValueError as e:
                    _warn(f"incr store {self.store_path}: damaged index node "
                          f"{(p.ikey + p.node).hex()[:16]}… ignored ({e}); the value will be "
                          f"recomputed", DamagedRecordWarning)
                    return self.no_match(p)
                except Exception as e:
                    _warn(f"incr store {self.store_path}: lookup failed ({e}); computing "
                          f"{m.label()}", DamagedRecordWarning)
                    return self.no_match(p)
                if d is None:
                    return self.no_match(p)
                p.resolved.append(d)
            if d.flags & F_DEFERRED:
                # set aside in this pass: m waits with it; its lookup starts again then
                p.cands = None
                p.resolved = None
                p.node = None
                m.flags |= F_DEFERRED
                self.deferred.append(m)
                return DONE
            if isinstance(d, Instance) and _needs_work(d) and not (
                    not (d.flags & F_HAS_VALUE) and d in self.failed):
                # (an instance that failed in this pass is not pushed again: a mismatch)
                if d.flags & (F_VERIFYING | F_RUNNING):
                    return self.no_match(p)
                d.flags |= F_VERIFYING
                stack.append(d)
                idx.append(0)
                return PUSHED
            if not (d.flags & F_HAS_VALUE) or not self.value_hash(d):
                return self.no_match(p)
            if isinstance(d, Input):
                p.node = _index_step(p.node, b"i", (<Input>d).name.encode("utf-8"), d.vhash)
            else:
                p.node = _index_step(p.node, b"c", (<Instance>d).persist.ikey, d.vhash)
            p.di += 1
        rec = <Record>p.cands[0]
        resolved = p.resolved
        if rec.ndeps != len(resolved):
            return self.no_match(p)
        for i in range(rec.ndeps):
            d = <Node>resolved[i]
            if not _dep_names(rec, i, d) or not _blob_equals(rec.data, _dep_hash_at(rec, i),
                                                             d.vhash):
                return self.no_match(p)
        if m.cell.is_llm:
            # a candidate withdrawn by evidence (or a node not stable) is not taken back
            from incr import llmnodes as _llm
            if not _llm._may_adopt(self, m, _blob_bytes(rec.data, rec.vh_at)):
                return self.no_match(p)
        p.cands = None
        p.resolved = None
        try:
            self.adopt(m, rec, resolved)
        except _keys.DecodeError as e:
            _warn(f"incr store {self.store_path}: the stored value of "
                  f"{m.label()} does not decode ({e}); recomputing",
                  DamagedRecordWarning)
            self.n_store_misses += 1
            return NOMATCH
        return DONE

    cdef int no_match(self, Persist p):
        p.cands = None
        p.resolved = None
        p.node = None
        self.n_store_misses += 1
        return NOMATCH

    cdef object index_node(self, bytes key):
        # the index node at key, or None: committed (in the pass's read transaction), with
        # what waits for the next commit (durability="group") first
        if self.store.pass_ops is None:
            self.store.pass_cursor()
        iops = <tuple>self.store._iops
        v = iops[1]() if iops[0](key) else None
        pending = <dict>self.store.pending_index
        if pending:
            items = pending.get(key)
            if items is not None:
                return _index_merge(v, items)
        return v

    cdef Record index_entry(self, bytes ikey, bytes key):
        # the sound record of the entry `key` (of ikey), or None; a damaged one is reported
        # to the store (a warning now, replaced at the next commit)
        cdef Py_ssize_t n = len(ikey)
        if len(key) <= n or key[:n] != ikey:
            raise ValueError("it names an entry of another instance")
        data = (<dict>self.store.pending).get(key)   # (waits for the next commit)
        if data is None:
            iops = <tuple>self.store._iops
            if not iops[2](key):
                return None            # dropped by gc
            data = iops[3]()
        try:
            return _read_record(key, data)
        except ValueError as e:
            self.store.damaged_record(key, str(e))
            return None

    cdef object index_choose(self, bytes ikey, bytes v):
        # What the index node v leads to: its alternatives (most recently written first) are
        # the next dependency read (b"i" blob(name) | b"c" blob(identity) blob(args)
        # blob(instance key)) or the entry (b"E" blob(entry key)); the first that names a
        # node of this process (a dependency), or a sound entry (a Record), is taken; None if
        # none does. ValueError if v is damaged. (After a dependency's code was edited, the
        # node holds both identities: only the live one resolves.)
        cdef const unsigned char *p = <const unsigned char *>PyBytes_AS_STRING(v)
        cdef Py_ssize_t n = len(v), at = 0, a, b, c, end
        cdef unsigned char kind
        if n == 0:
            raise ValueError("an empty index node")
        while at < n:
            kind = p[at]
            if at + 5 > n:
                raise ValueError("an index node's item is cut short")
            a = at + 1                          # the first blob
            end = a + 4 + _u32(p + a)
            if end > n:
                raise ValueError("a blob overruns the index node")
            if kind == 0x63:                    # 'c': two more blobs
                b = end
                if b + 4 > n:
                    raise ValueError("a blob overruns the index node")
                c = b + 4 + _u32(p + b)
                if c + 4 > n:
                    raise ValueError("a blob overruns the index node")
                end = c + 4 + _u32(p + c)
                if end > n:
                    raise ValueError("a blob overruns the index node")
                d = self.resolve_cell(v[a + 4:b].decode("utf-8", "strict"), v, b)
                if d is not None:
                    return d
            elif kind == 0x69:                  # 'i'
                d = self.inputs.get(v[a + 4:end].decode("utf-8", "strict"))
                if d is not None:
                    return d
            elif kind == 0x45:                  # 'E'
                rec = self.index_entry(ikey, v[a + 4:end])
                if rec is not None:
                    return rec
            else:
                raise ValueError("an unknown kind of index item")
            at = end
        return None

    cdef void adopt(self, Instance m, Record rec, list resolved) except *:
        cdef const unsigned char *p = <const unsigned char *>PyBytes_AS_STRING(rec.data)
        value = _decode_at(rec.data, rec.val_at + 4, _u32(p + rec.val_at))
        cdef bint had = (m.flags & F_HAS_VALUE) != 0
        if had and _same_value(m.value, value):
            pass  # same value: dependents are not disturbed
        else:
            m.value = value
            m.changed_at = self.clock
            m.changed_rev = self.revision
        m.vhash = _blob_bytes(rec.data, rec.vh_at)
        self.rewire(m, m.deps, resolved)
        m.verified_at = self.clock
        m.ran_rev = self.revision
        m.flags = (m.flags | F_HAS_VALUE) & ~F_DIRTY
        m.last_action = A_LOADED
        self.raise_ts(m)
        _add_usage_tag(self.store.hit_tags, rec.key)
        self.n_store_hits += 1
        self.n_reused += 1
        if self.report_log is not None:
            self.report_log.append((m, A_LOADED))

    cdef Node resolve(self, Record rec, Py_ssize_t i):
        # The node dependency i of rec names in this process, or None. A cell dependency is
        # named by its cell identity and arguments, and its instance key, which must agree.
        cdef const unsigned char *p = <const unsigned char *>PyBytes_AS_STRING(rec.data)
        cdef Py_ssize_t at = rec.deps_at[i]
        cdef Py_ssize_t args_at, args_n
        cdef Cell c
        cdef Instance n
        name = _rec_str(rec, _u32(p + at + 1))
        if p[at] == 0x69:   # 'i'
            return self.inputs.get(name)
        return self.resolve_cell(name, rec.data, at + 5)

    cdef Node resolve_cell(self, str name, bytes data, Py_ssize_t args_at):
        # The instance named by cell identity `name` and the blobs at args_at in data: its
        # canonical arguments, then its instance key, which must agree; or None.
        cdef const unsigned char *p = <const unsigned char *>PyBytes_AS_STRING(data)
        cdef Py_ssize_t args_n = _u32(p + args_at)
        cdef Cell c
        cdef Instance n
        co = _stored_cells.get(name, _stored_cells)
        if co is _stored_cells:
            co = _keys.stored_cell(name)
        if co is None:
            return None
        c = <Cell>co
        args = _decode_simple(data, args_at + 4, args_n)
        if args is _NOT_SIMPLE:
            args = _stored_args(self, data[args_at + 4:args_at + 4 + args_n])
            if args is None:
                return None
        elif type(args) is not tuple:
            return None
        try:
            n = self.lookup(c, self.table_for(c), args, True)
        except TypeError:
            return None
        if n.persist is None:
            # its persistent identity is the reference we resolved: no need to re-encode
            self.persist_with(n, name, _blob_bytes(data, args_at))
        if not n.persist.ok or not _blob_equals(data, args_at + 4 + args_n, n.persist.ikey):
            return None   # the record does not agree with itself: not this instance
        return n

    cdef Persist persist_of(self, Instance n):
        cdef Persist p
        ident = _keys.cell_identity(n.cell)
        if ident is None:
            _warn_once(n.cell, f"incr: {n.cell.name} shares its identity with another live "
                               f"cell, so neither is stored; give them distinct version=")
        else:
            try:
                return self.persist_with(n, ident, _keys.encode(n.args))
            except TypeError as e:
                _warn_once(n.cell, f"incr: arguments of {n.label()} cannot be stored ({e})")
        p = Persist()
        n.persist = p
        return p

    cdef Persist persist_with(self, Instance n, str ident, bytes args):
        # n's persistent identity, set
        cdef Persist p = Persist.__new__(Persist)
        p.ident = ident
        p.args = args
        p.ikey = _instance_key(ident, args, self.hash)
        p.ok = True
        n.persist = p
        return p

    cdef object value_hash(self, Node n):
        if n.vhash is None:
            try:
                n.vhash = _keys.digest("value", _keys.encode_value(n.value), self.hash)
            except TypeError:
                n.vhash = b""
        return n.vhash

    cdef void record(self, Instance n) except *:
        # Store n's value with the content hashes of the dependencies it read: a constructive
        # trace keyed by its immediate dependencies, so cutoff holds across processes.
        cdef Persist p = n.persist
        cdef Node d
        cdef Persist dp
        if p is None:
            p = self.persist_of(n)
        if not p.ok:
            return
        try:
            val = _keys.encode_value(n.value)
        except TypeError as e:
            n.vhash = b""
            _warn_once(n.cell, f"incr: the value of {n.label()} cannot be stored, so it stays "
                               f"in memory only ({e})")
            return
        n.vhash = _keys.digest("value", val, self.hash)
        cdef list stored = []   # the references, with instance keys, as the record holds them
        cdef list deps = self.refs(n.deps, stored)   # what the trace hash is taken of
        if deps is None:
            return  # it read something that cannot be named or hashed: nothing to verify it by
        trace = _keys.digest("trace", _msgpack.packb(deps, use_bin_type=True), self.hash)
        self.store.put(p.ikey + trace, _pack_record(p.ident, n.label(), p.args, val, n.vhash,
                                                    stored, self.store.run),
                       _index_nodes(p.ikey, p.ikey + trace, stored))

    cdef list refs(self, object nodes, list stored=None):
        # [kind, ref, value hash] naming each node (and, into ``stored``, the same with
        # instance keys, as a record holds them), or None if one cannot be named or hashed
        cdef Node d
        cdef Persist dp
        out = []
        for d in nodes:
            if not (d.flags & F_HAS_VALUE):
                return None
            h = self.value_hash(d)
            if not h:
                return None
            if isinstance(d, Input):
                out.append(["i", (<Input>d).name, h])
                if stored is not None:
                    stored.append(("i", (<Input>d).name, h))
            else:
                dp = (<Instance>d).persist
                if dp is None:
                    dp = self.persist_of(<Instance>d)
                if not dp.ok:
                    return None
                out.append(["c", [dp.ident, dp.args], h])
                if stored is not None:
                    stored.append(("c", dp.ident, dp.args, dp.ikey, h))
        return out

    cdef void flush(self, bint quiet) except *:
        # the end of a top-level demand or pass: commit now ("sync") or within the group
        # interval ("group", see Store.commit_due)
        if quiet:
            try:
                self.store.commit_due()
            except Exception:
                pass
        else:
            self.store.commit_due()

    cdef bint run_in_stack(self, Instance m, bint bottom) except -1:
        # Run m from a verification stack. A failure of an instance that is not the one
        # demanded is kept for this pass (self.failed): its dependent then re-runs and meets
        # the same exception where it reads it, exactly as a from-scratch run would.
        if bottom:
            self.run(m)
            return True
        try:
            self.run(m)
        except Exception:
            return False
        return True

    cdef void fail(self, Instance n, list reads, bint had, BaseException e, str where) except *:
        # A failed run keeps nothing: no value (a change, if it had one); the dependencies it
        # read before failing stay as edges, so a reader that caught the exception is made
        # stale when what caused it changes. The exception is kept for the rest of the pass.
        cdef str chain
        if isinstance(e, (_Suspend, _CancelledError)):
            # -- unwound to an await (incr._aio), or cancelled ---------------------------------
            # Nothing is recorded: n keeps its value, dependencies and stamps and stays stale;
            # it runs again when demanded.
            n.flags &= ~F_RUNNING
            return
        if isinstance(e, _Deferred):
            # -- set aside (see attempt) ------------------------------------------------------
            # Not a failure: stabilize runs the work ahead and this run starts again in the
            # next pass. It leaves nothing behind: n keeps its value, dependencies and stamps,
            # stays stale, and waits (F_DEFERRED), as does whatever reads it.
            n.flags = (n.flags & ~F_RUNNING) | F_DEFERRED
            self.deferred.append(n)
            if n.observed_by is not None:
                self.dirty_observed.append(n)
            return
        n.flags &= ~(F_RUNNING | F_HAS_VALUE | F_DIRTY)
        self.rewire(n, n.deps, reads)
        n.value = None
        n.vhash = None
        if had:  # losing a value is a change; failing again is not
            n.changed_at = self.clock
            n.changed_rev = self.revision
        n.verified_at = self.clock
        n.ran_rev = self.revision
        n.last_action = A_FAILED
        self.failed[n] = e
        self.n_failed += 1
        if n.observed_by is not None:
            self.dirty_observed.append(n)
        self.raise_ts(n)
        if not getattr(e, "_incr_noted", False):
            chain = " <- ".join([(<Frame>x).node.label() for x in reversed(self.frames)])
            _add_note(e, f"incr: {where} {n.label()}" + (f", called from {chain}" if chain else ""))
            try:
                e._incr_noted = True
            except Exception:
                pass
        if self.report_log is not None:
            self.report_log.append((n, A_FAILED))

    cdef inline Frame new_frame(self, Instance n):
        cdef Frame f
        self.frame_ids += 1
        f = Frame.__new__(Frame)
        f.node = n
        f.reads = []
        f.id = self.frame_ids
        return f

    cdef Frame run_begin(self, Instance n):
        # push n's frame and mark it running (run, and incr._aio for an async cell)
        cdef Frame f = self.new_frame(n)
        if not self.frames:
            self.owner = PyThread_get_thread_ident()
        self.frames.append(f)
        n.flags = (n.flags | F_RUNNING) & ~F_INVALID
        return f

    cdef bint run(self, Instance n) except -1:
        cdef Frame f
        cdef bint had = (n.flags & F_HAS_VALUE) != 0
        cdef object value
        if n.cell.is_async:
            # an async cell: run on this thread's event loop (sync code), or, inside a
            # running loop, unwind to the nearest await, which runs it (incr._aio)
            return _aio_mod().run_sync(self, n)
        cdef Py_ssize_t unwinding = len(self.unwinding) if _async_defined else 0
        f = self.run_begin(n)
        try:
            if self.remote is n:
                value = self.prefetch.take(n)   # an executor's result; its reads replayed
            elif n.fresh_args:
                value = n.cell.invoke(_keys.own_args(n.args))   # a copy it may mutate
            else:
                value = n.cell.invoke(n.args)
            if _async_defined and len(self.unwinding) > unwinding:
                # the function caught the unwinding for async work (an `except BaseException`
                # or a bare `except:`) and returned: its value may rest on a failure that was
                # not one. Not kept: the unwinding goes on, and it runs again after the work
                works = self.unwinding[unwinding:]
                del self.unwinding[unwinding:]
                raise _Suspend(works)
        except BaseException as e:
            self.frames.pop()
            self.fail(n, f.reads, had, e, "raised in cell")
            raise
        self.frames.pop()
        return self.run_end(n, f, had, value)

    cdef bint run_end(self, Instance n, Frame f, bint had, object value) except -1:
        # record a finished run of n (its frame already popped): cutoff, edges, stamps, store
        cdef bint same
        if type(value) is _CoroutineType:
            value.close()   # never awaited: no "never awaited" warning, and never a value
            e = TypeError(f"{n.label()} returned a coroutine: the function is sync but "
                          f"returned an awaitable; await it inside the function, or make "
                          f"the function return the value. A coroutine is never a value.")
            self.fail(n, f.reads, had, e, "raised in cell")
            raise e
        n.flags &= ~F_RUNNING
        same = False
        if had:
            try:
                if n.cell.cutoff_kind == C_EQUAL:
                    same = _same_value(n.value, value)
                elif n.cell.cutoff_kind == C_IDENTITY:
                    same = n.value is value
                elif n.cell.cutoff_kind == C_CALLABLE:
                    same = bool(n.cell.cutoff(n.value, value))
            except BaseException as e:
                self.fail(n, f.reads, had, e, "raised in the cutoff of cell")
                raise
        self.rewire(n, n.deps, f.reads)
        if not same:
            n.vhash = None
        if same:
            n.last_action = A_CUTOFF
            self.n_cutoff += 1
            self.n_recomputed += 1
        else:
            n.value = value
            n.changed_at = self.clock
            n.changed_rev = self.revision
            if had:
                n.last_action = A_RECOMPUTED
                self.n_recomputed += 1
            else:
                n.last_action = A_COMPUTED
                n.why = None
                self.n_computed += 1
        n.verified_at = self.clock
        n.ran_rev = self.revision
        n.flags = (n.flags | F_HAS_VALUE) & ~F_DIRTY
        self.raise_ts(n)
        if self.store is not None:
            try:
                self.record(n)
            except Exception as e:  # persistence is best effort: the value stays in memory
                _warn_once(n.cell, f"incr: {n.label()} could not be stored ({e!r})")
        if self.report_log is not None:
            self.report_log.append((n, n.last_action))
        return True

    cdef void rewire(self, Instance n, tuple old, list new):
        cdef Py_ssize_t i, k = len(old)
        cdef Node d
        if k == len(new):
            for i in range(k):
                if old[i] is not new[i]:
                    break
            else:
                return
        for d in old:
            d.dependents.remove(n)
        for d in new:
            if d.dependents is None:
                d.dependents = [n]
            else:
                d.dependents.append(n)
        n.deps = tuple(new)

    cdef void raise_ts(self, Instance n):
        # keep I4: n after all its deps; then every dependent after n, transitively
        cdef Node d
        cdef Instance m
        cdef long long top = 0
        for d in n.deps:
            if d.ts > top:
                top = d.ts
        if n.ts > top:
            return
        self.ts_clock += 1
        n.ts = self.ts_clock
        if n.dependents is None:
            return
        cdef list stack = [n]
        while stack:
            d = <Node>stack.pop()
            if d.dependents is None:
                continue
            for m in d.dependents:
                if m.ts <= d.ts:
                    self.ts_clock += 1
                    m.ts = self.ts_clock
                    stack.append(m)

    cdef void dirty_from(self, Node n):
        # walked by index: a list used as a stack that empties and refills reallocates
        cdef Instance m
        cdef Py_ssize_t i = 0
        if n.dependents is None:
            return
        cdef list todo = list(n.dependents)
        while i < len(todo):
            m = <Instance>todo[i]
            i += 1
            if m.flags & F_DIRTY:
                continue
            m.flags |= F_DIRTY
            if m.observed_by is not None:
                self.dirty_observed.append(m)
            if m.dependents is not None:
                todo.extend(m.dependents)

    cdef void set_input(self, Input inp, object value) except *:
        self.check_usable()
        if self.other_busy() or (self.frames and PyThread_get_thread_ident() != self.owner
                                 and self.busy_depth):
            # another thread's pass works on the current revision: this change forms the
            # next one, applied when that pass ends (never a mix of old and new in it)
            self.pending_sets.append((inp, value))
            return
        if self.frames:
            raise ReentrancyError(self._reentrancy(f"set input {inp.name!r}"))
        if self.stabilizing:
            raise ReentrancyError(self._reentrancy(f"set input {inp.name!r}"))
        cur = get_value(_active)
        if cur is not None and cur is not self and (<Runtime>cur).frames:
            raise ReentrancyError((<Runtime>cur)._reentrancy(f"set input {inp.name!r}"))
        self.apply_set(inp, value)

    cdef void apply_set(self, Input inp, object value) except *:
        if _same_value(inp.value, value):
            return
        inp.value = value
        inp.vhash = None
        self.clock += 1
        if self.batch_depth == 0:
            self.revision += 1
        elif not self.batch_bumped:
            self.revision += 1
            self.batch_bumped = True
        inp.changed_at = self.clock
        inp.changed_rev = self.revision
        self.dirty_from(inp)


cdef enum:
    DONE = 0
    PUSHED = 1
    NOMATCH = 2


cdef list _notify(list due, Runtime rt):
    # Call the callbacks of every observer in ``due`` once with its instance's value. An
    # exception from a callback is collected and the rest still run; an interrupt
    # (KeyboardInterrupt, SystemExit) keeps the observers not yet served for the next pass.
    cdef Observer o
    cdef Py_ssize_t i
    cdef list errors = []
    for i in range(len(due)):
        o = <Observer>due[i]
        if not o.active or not (o.node.flags & F_HAS_VALUE) or o.seen_at == o.node.changed_at:
            continue
        o.seen_at = o.node.changed_at
        value = o.node.value
        try:
            for cb in list(o.callbacks):
                try:
                    cb(value)
                except Exception as e:
                    _add_note(e, f"incr: raised in an on_change callback of {o.node.label()}")
                    errors.append(e)
        except BaseException:
            o.seen_at = -1      # delivered again in full next time rather than lost
            rt.unnotified.extend(due[i:])
            raise
    return errors


def _group(str message, list errors):
    try:
        return ExceptionGroup(message, errors)
    except NameError:   # Python 3.10: the first, with the others attached
        e = errors[0]
        e.incr_exceptions = list(errors)
        return e


def _stale_evidence(Runtime rt, Instance n):
    # I7 for a clean LLM node instance: its state holds the stable candidate, and nothing its
    # acceptance rests on (what incr.llmnodes recorded as read before each verdict on the
    # current revision) changed or was withdrawn since without n being verified again
    cdef Node d
    from incr import llmnodes as _llm
    own, basis = _llm._evidence(rt, n)
    out = [f"I7: {n.label()} {p}" for p in own]
    for what, d, at in basis:
        if d.changed_at != at or _needs_work(d) or d.flags & F_INVALID:
            out.append(f"I7: {n.label()} is clean, but {what} was made under "
                       f"{_node_label(d)} as of tick {at}, which has since "
                       f"{'changed (tick ' + str(d.changed_at) + ')' if d.changed_at != at else 'been withdrawn or made stale'}"
                       f" without {n.label()} being verified again")
    return out


import sys as _sys
cdef str _INCR_DIR = _os.path.dirname(_os.path.abspath(__file__)) + _os.sep


def _user_level():
    # the stacklevel that names the user's line: compiled functions have no Python frame, so
    # a fixed level walks past the caller (to "sys:1"); count the innermost Python frames that
    # belong to incr itself instead
    f = _sys._getframe(0)
    level = 1
    while f is not None and f.f_code.co_filename.startswith(_INCR_DIR):
        f = f.f_back
        level += 1
    return level if f is not None else 1


def _warn(message, category):
    _warnings.warn(message, category, stacklevel=_user_level())


def _warn_once(Cell cell, str message):
    if not getattr(cell, "_incr_warned", False):
        setattr(cell, "_incr_warned", True)
        _warn(message, NotPersistableWarning)


def _ts_key(Instance n):
    return n.ts


cdef str _node_label(Node d):
    if isinstance(d, Instance):
        return (<Instance>d).label()
    return f"input {(<Input>d).name!r}"


def _explain(Runtime rt, Instance n):
    cdef Node w
    lab = n.label()
    if n.flags & F_DIRTY:
        tail = (f"; it is stale now (a dependency changed after revision {n.ran_rev}) and "
                f"will be checked at its next demand")
    else:
        tail = ""
    act = n.last_action
    if act == A_NONE:
        return f"{lab} has never been computed on this runtime"
    if act == A_FAILED:
        return f"{lab} raised on its last run, at revision {n.ran_rev}; it runs again at its next demand"
    if act == A_LOADED:
        text = (f"{lab} was taken from the store at revision {n.ran_rev}: the dependencies it "
                f"read hash the same as when it was stored, so it did not run")
    elif act == A_COMPUTED:
        text = f"{lab} was computed for the first time at revision {n.ran_rev}"
    elif act in (A_RECOMPUTED, A_CUTOFF):
        w = n.why
        if w is None:
            cause = "its previous run had failed"
        elif w is n:
            cause = "its previous value was withdrawn (a NACK against the candidate it held)"
        elif not (w.flags & F_HAS_VALUE):
            cause = f"{_node_label(w)} had failed"
        else:
            cause = f"{_node_label(w)} changed at revision {w.changed_rev}"
        text = f"{lab} was recomputed at revision {n.ran_rev} because {cause}"
        if act == A_CUTOFF:
            text += (f"; the new value equals the old one (cutoff), so its dependents were not "
                     f"disturbed and it counts as unchanged since revision {n.changed_rev}")
    else:
        text = (f"{lab} was reused: verified at revision {rt.revision} with no dependency "
                f"changed since its last run at revision {n.ran_rev}")
    deps = ", ".join(_node_label(d) for d in n.deps)
    if deps:
        text += f". It read: {deps}"
    return text + tail


cdef bint _dep_names(Record r, Py_ssize_t i, Node d):
    # whether dependency i of r names d: an input by its name, a cell by its instance key
    cdef const unsigned char *p = <const unsigned char *>PyBytes_AS_STRING(r.data)
    cdef Py_ssize_t at = r.deps_at[i]
    if p[at] == 0x69:   # 'i'
        return isinstance(d, Input) and _rec_str(r, _u32(p + at + 1)) == (<Input>d).name
    if not isinstance(d, Instance) or (<Instance>d).persist is None:
        return False
    at += 5
    at += 4 + _u32(p + at)        # past the arguments: the instance key
    return _blob_equals(r.data, at, (<Instance>d).persist.ikey)


cdef dict _stored_cells = _keys.stored_cells
cdef object _InputRef = _keys._InputRef


cdef object _stored_args(Runtime rt, bytes data):
    # stored argument bytes decoded by the general decoder, with this runtime's inputs in
    # place of input references; None if they do not decode to a tuple or name an unknown input
    try:
        args = _keys.decode(data)
    except _keys.DecodeError:
        return None
    if type(args) is not tuple:
        return None
    return _with_inputs(rt, <tuple>args)


cdef object _with_inputs(Runtime rt, tuple args):
    # decoded arguments with input references replaced by this runtime's inputs; None if one
    # is not declared here
    cdef bint refs = False
    for a in args:
        if isinstance(a, _InputRef):
            refs = True
            break
    if not refs:
        return args
    out = []
    for a in args:
        if isinstance(a, _InputRef):
            a = rt.inputs.get(a)
            if a is None:
                return None
        out.append(a)
    return tuple(out)
