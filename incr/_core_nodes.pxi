# The nodes of the trace and the Python-visible objects around them: cutoff policies, Node,
# Input, Instance, Persist, Cell, Frame, Stabilization, Observer, _Batch. Fields and their
# invariants are in _core.pxd; the algorithms that change them are in the other parts.
#
# Contract:
#   - Input.get records a read into the running frame (record_read, _core_demand.pxi) or, in
#     a worker thread running ahead, logs it for replay; Input.set goes through set_input
#     (_core_propagate.pxi) and never changes the trace during another thread's pass;
#   - calling a Cell binds its arguments (the instance's own copy: never the caller's
#     objects), finds or makes the Instance (lookup) and demands it (demand); a call from
#     async code returns an awaitable (incr._aio);
#   - an Observer keeps I5: its instance, dirty or without a value, is in rt.dirty_observed.


from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_DECREF


class _CutoffPolicy:
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"incr.{self.name}"


EQUAL = _CutoffPolicy("EQUAL")
IDENTITY = _CutoffPolicy("IDENTITY")
NEVER = _CutoffPolicy("NEVER")


def _refuse_coroutine_function(fn, what):
    """TypeError for a coroutine function (or an object whose ``__call__`` is one) where incr
    calls ``fn`` from sync code and uses its result: the coroutine it would return is truthy,
    never awaited, and never a value (a cutoff would call every change "unchanged")."""
    for f in (fn, getattr(type(fn), "__call__", None)):
        if f is not None and (inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f)):
            name = getattr(fn, "__qualname__", None) or repr(fn)
            raise TypeError(f"{what} {name!r} is an async function; it must be a plain def "
                            f"(incr calls it from sync code and uses its result; a coroutine "
                            f"is never a value)")


cdef extern from "math.h":
    bint signbit(double x) nogil


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
        self.shadow = own_copy(value)
        self.flags = F_INPUT | F_HAS_VALUE
        rt.ts_clock += 1
        self.ts = rt.ts_clock
        self.changed_at = rt.clock
        self.changed_rev = rt.revision

    @property
    def _incr_input_name(self):
        return self.name

    @cython.binding(False)    # a METH_NOARGS method: the hottest read (no CyFunction call)
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
            record_read(rt, self)
        else:
            if rt.prefetch is not None and rt.prefetch.reading:
                rt.prefetch.read(self)   # a generator running ahead, in a worker thread
            if _async_defined:
                tf = get_value(_task_frames)
                if tf and (<Frame>tf[len(tf) - 1]).node.rt is rt:
                    # a task that an async cell's run spawned (asyncio.gather of a coroutine
                    # of its own): the read belongs to that run
                    record_into(rt, <Frame>tf[len(tf) - 1], self)
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
        set_input(self.rt, self, value)

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
        if version is not None and (type(version) is bool
                                    or not isinstance(version, (str, int))):
            # the version names the definition across processes (its repr goes into every
            # stored key): an object whose repr differs per process would never match
            raise TypeError(
                f"incr.cell {qual}: version must be a str or an int (it names this definition "
                f"in the store, across processes), got {version!r} "
                f"({type(version).__qualname__})")
        if isinstance(version, str):
            try:
                version.encode("utf-8")
            except UnicodeEncodeError as e:
                raise TypeError(f"incr.cell {qual}: version must be valid text (it is stored "
                                f"as UTF-8), got {version!r}: {e}") from None
        self.version = version
        if cutoff is EQUAL:
            self.cutoff_kind = C_EQUAL
        elif cutoff is IDENTITY:
            self.cutoff_kind = C_IDENTITY
        elif cutoff is NEVER:
            self.cutoff_kind = C_NEVER
        elif callable(cutoff):
            _refuse_coroutine_function(cutoff, f"incr.cell {qual}: cutoff")
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
            ba = self.signature.bind(*args, **(kwargs or {}))
        except TypeError as e:
            raise TypeError(f"{self.qualname_label}(): {e}") from None
        ba.apply_defaults()
        return tuple(ba.arguments.values())

    cdef object invoke(self, tuple args):
        if self.signature is None or self.n_positional == len(self.param_names):
            # (vectorcall on the tuple's items: no unpacking through PyObject_Call)
            return PyObject_Vectorcall(self.fn, (<PyTupleObject *>args).ob_item,
                                       PyTuple_GET_SIZE(args), NULL)
        ba = inspect.BoundArguments(self.signature, dict(zip(self.param_names, args)))
        return self.fn(*ba.args, **ba.kwargs)

    def __cinit__(self, *args, **kwargs):
        if type(self) is Cell:
            self.vectorcall = <void *>_cell_vectorcall

    def __call__(self, *args, **kwargs):
        # (a plain Cell is called through _cell_vectorcall; subclasses come here)
        return self.call(args, kwargs)

    cdef object call(self, tuple args, dict kwargs):
        # a call of the cell: kwargs None or empty when there are none
        cdef Runtime rt = <Runtime>get_value(_active)
        cdef dict table
        cdef Instance n
        if rt is None:
            rt = <Runtime>current()
        if rt is self.cached_rt:
            n = self.cached_inst
            if n is not None and not args and not kwargs:
                # a zero-parameter cell: its one instance, no key built
                if self.awaited or (_async_defined and not rt.frames):
                    return self.call_slow(rt, n)
                return demand(rt, n)
            table = self.cached_table
        else:
            table = table_for(rt, self)
            self.cached_rt = None    # (releasing the old runtime may run code: the cache is
            self.cached_inst = None  # consistent before and after)
            self.cached_table = table
            self.cached_rt = rt
        n = lookup(rt, self, table, self.bound(args, kwargs), True)
        if not self.param_names and self.signature is not None and self.cached_rt is rt:
            self.cached_inst = n
        if self.awaited or (_async_defined and not rt.frames):
            return self.call_slow(rt, n)
        return demand(rt, n)

    cdef object call_slow(self, Runtime rt, Instance n):
        cdef list frames
        if self.awaited:
            frames = rt.frames
            if rt.prefetch is not None and rt.prefetch.is_worker():
                # a worker thread is sync code: the frames are the driver's (see _aio.call)
                return _aio_mod().call(rt, n)
            if frames and (<Frame>frames[len(frames) - 1]).node.cell.is_async:
                # in an async cell's body (the usual case): an awaitable (_core_async.pxi)
                return new_await(rt, n, tuple(frames))
            return _aio_mod().call(rt, n)
        tf = get_value(_task_frames)
        if tf and (<Frame>tf[len(tf) - 1]).node.rt is rt:
            # in a task an async cell's run spawned: the demand is that run's read
            return _aio_mod().in_task(rt, n, tf)
        return demand(rt, n)

    def aget(self, *args, **kwargs):
        """Await this cell's value for these arguments (sync or async cell), from async code:
        ``await cell.aget(x)``. Async work it needs runs concurrently with other tasks."""
        cdef Runtime rt = <Runtime>get_value(_active)
        if rt is None:
            rt = <Runtime>current()
        return _aio_mod().ademand(rt, lookup(rt, self, table_for(rt, self),
                                                self.bound(args, kwargs), True))

    def map(self, iterable):
        """``[self(*a) for a in iterable]``, demanded at once (see ``incr.gather``): each item
        is a tuple of arguments, or a single argument that is not a tuple."""
        try:
            it = iter(iterable)
        except TypeError:
            raise TypeError(f"{self.name}.map: needs an iterable of arguments (tuples, or single "
                            f"arguments), got {iterable!r}") from None
        items = [a if type(a) is tuple else (a,) for a in it]
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


cdef extern from "Python.h":
    Py_ssize_t PyVectorcall_NARGS(size_t nargsf)
    ctypedef struct PyTypeObject:
        Py_ssize_t tp_vectorcall_offset
        unsigned long tp_flags
    unsigned long Py_TPFLAGS_HAVE_VECTORCALL

from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM, PyTuple_GET_SIZE
from cpython.dict cimport PyDict_GetItemWithError
cdef extern from "Python.h":
    ctypedef struct PyTupleObject:
        PyObject *ob_item[1]
    object PyObject_Vectorcall(object callable, PyObject **args, size_t nargsf,
                               PyObject *kwnames)
cdef tuple _NO_ARGS = ()


cdef object _cell_vectorcall(object callable, PyObject **args, size_t nargsf,
                             PyObject *kwnames):
    # Cell.__call__ through the vectorcall protocol: no **kwargs dict is built for a call
    # without keywords (Cython's tp_call makes an empty one on every call)
    cdef Py_ssize_t i, n = PyVectorcall_NARGS(nargsf)
    cdef tuple t
    cdef dict kw = None
    cdef object a
    cdef Cell c = <Cell>callable
    cdef Runtime rt
    cdef type ty
    cdef PyObject *found
    if (n == 0 or n == 1) and (kwnames is NULL or not len(<tuple>kwnames)):
        # the hot paths: the instance found without building a key (a zero-parameter cell's
        # cached instance; one str/int/None argument, its own key) in the cached table
        rt = <Runtime>get_value(_active)
        if rt is not None and rt is c.cached_rt:
            if n == 0:
                found = <PyObject *>c.cached_inst if c.cached_inst is not None else NULL
            elif c.n_positional == 1 and c.simple:
                a = <object>args[0]
                ty = type(a)
                if ty is int or ty is str or a is None:
                    found = PyDict_GetItemWithError(c.cached_table, a)   # (str/int/None: no error)
                else:
                    found = NULL
            else:
                found = NULL
            if found is not NULL:
                if c.awaited or (_async_defined and not rt.frames):
                    return c.call_slow(rt, <Instance>found)
                return demand(rt, <Instance>found)
    if n == 0:
        t = _NO_ARGS
    else:
        t = PyTuple_New(n)
        for i in range(n):
            a = <object>args[i]
            Py_INCREF(a)
            PyTuple_SET_ITEM(t, i, a)
    if kwnames is not NULL and len(<tuple>kwnames):
        kw = {}
        for i in range(len(<tuple>kwnames)):
            kw[(<tuple>kwnames)[i]] = <object>args[n + i]
    return c.call(t, kw)


cdef _enable_cell_vectorcall():
    # Cell instances carry their vectorcall pointer in the `vectorcall` field; tell the type
    # where it is. A Python subclass (mutable type) does not inherit the flag, and its
    # instances leave the field NULL, so they go through tp_call and their own __call__.
    cdef Cell probe = Cell.__new__(Cell)
    cdef PyTypeObject *tp = <PyTypeObject *>Cell
    tp.tp_vectorcall_offset = <Py_ssize_t>(<char *>&probe.vectorcall - <char *><PyObject *>probe)
    tp.tp_flags |= Py_TPFLAGS_HAVE_VECTORCALL


_enable_cell_vectorcall()


cdef str _label(Cell c, tuple args):
    return c.qualname_label + "(" + ", ".join([repr(a) for a in args]) + ")"


cdef object _fast_key(tuple args):
    # str, int and None stand for themselves in keys (bool and float are tagged by keys.py);
    # one such argument is its own key, as in lru_cache (no tuple hashed or compared; every
    # other key is a tuple, so the two never meet). None when keys.py must build the key.
    cdef object a
    cdef type t
    if PyTuple_GET_SIZE(args) == 1:
        a = (<tuple>args)[0]
        t = type(a)
        if t is str or t is int or a is None:
            return a
        return None
    for a in args:
        t = type(a)
        if t is not str and t is not int and a is not None:
            return None
    return args


cdef class Frame:
    """A running computation (internal). Built in Runtime.run without __init__."""


cdef class Stabilization:
    """What one ``rt.stabilize()`` did: ``recomputed`` (labels of the instances that ran, in
    run order, cut off ones included), ``cutoff`` (those that ran to an equal value),
    ``loaded`` (taken from the store), ``reused`` (count verified without running),
    ``seconds`` and ``revision``. Labels are built when first read, not during the pass."""

    # (a compiled class: the pass fills its fields without a Python call; _report())

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


cdef Stabilization _report(list log, long long reused, double seconds, long long revision):
    # a pass's report, without the Python-level __init__ call
    cdef Stabilization r = Stabilization.__new__(Stabilization)
    r._log = log
    r.reused = reused
    r.seconds = seconds
    r.revision = revision
    return r


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
        _refuse_coroutine_function(callback, f"Observer.on_change of {self.node.label()}: callback")
        self.callbacks.append(callback)
        return callback

    def stop(self):
        """Stop observing; the instance is no longer refreshed by ``stabilize``. Idempotent."""
        if not self.active:
            return
        if other_busy(self.runtime):
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
        self.rt._batch_open()
        return self.rt

    def __exit__(self, *exc):
        self.rt._batch_close(exc[0] is not None)
        return False


_ACTIONS = {
    A_NONE: "none", A_COMPUTED: "computed", A_RECOMPUTED: "recomputed",
    A_CUTOFF: "cutoff", A_REUSED: "reused", A_FAILED: "failed", A_LOADED: "loaded",
}
