# The current runtime and the top-level entry points that are not methods: current(),
# untracked(), incr.gather (and its _Gather rounds), and the fork handler.
#
# Contract:
#   - current() is the runtime of the innermost `with rt:` / running computation in this
#     context (a contextvar), else the default runtime;
#   - untracked() records no read of what it demands into the running frame (rt.quiet), and
#     restores the previous quiet frame on every exit;
#   - gather demands every thunk even when one hands work to run ahead (_Deferred) or needs
#     async work (_Suspend), then raises that, so the pass gathers all of it at once; a
#     top-level gather with nothing above it runs the rounds itself (ahead_open/ahead_round/
#     ahead_close in _core_schedule.pxi);
#   - after fork(), a runtime another thread of the parent was computing on is closed in the
#     child with an error that says so.


_default_runtime = None
cdef long long _gather_seq = 0     # incr.gather calls made (each tags its thunks' reads)


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
        if rt.collecting:       # (other threads' collecting batches never close here)
            rt.collecting = {k: v for k, v in rt.collecting.items() if k == me} or None
        if (rt.busy_depth and rt.busy_thread != me or (rt.frames and rt.owner != me)
                or (rt.batch_thread and rt.batch_thread != me)):
            rt.forked_mid_run = (
                "this incr.Runtime was computing in another thread when the process forked, "
                "and that computation does not exist in the child; create a new Runtime in the "
                "child (on the same store, if it has one)")
            rt.closed = True
            rt.busy_depth = 0
            rt.busy_thread = 0
            rt.batch_thread = 0


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
        self.saved = quiet_enter(rt)
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
    would wait for each. The values and the dependencies recorded are those of calling them
    in order: ``[t() for t in thunks]`` (Salsa's ``par_map``). The model calls are those too,
    with one exception: a later thunk's call made concurrently is not taken back when an
    earlier thunk fails (in order, it would never have been made); it is made once, and its
    result is kept: a later demand of that node takes it, with no new call.

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
        _refuse_coroutine_function(t, "incr.gather(): the thunk")
    cdef Runtime rt = <Runtime>current()
    if rt.prefetch is not None and rt.prefetch.reading and rt.prefetch.is_worker():
        return _Gather(thunks).each()   # a generator running ahead: its reads are logged
    if not rt.frames and not rt.stabilizing:
        # at top level: one pass over all of them (one store commit, work gathered)
        if _async_defined and not rt.busy_depth and not _loop_running():
            # sync code: their async work runs concurrently, on this thread's loop
            return _aio_mod().drive(_aio_mod().gather_top(rt, thunks))
        check_usable(rt)
        token = _active.set(rt)
        enter(rt)
        try:
            return settle(rt, None, _Gather(thunks))
        finally:
            leave(rt)
            _active.reset(token)
    return _Gather(thunks)()


class _Gather:
    """Call every thunk; if some hand work over to run ahead (incr.errors._Deferred), go on
    with the others so that all of it is gathered, then raise it: the pass runs the work and
    calls again."""

    def __init__(self, thunks):
        self.thunks = thunks
        global _gather_seq
        _gather_seq += 1
        self.gid = _gather_seq      # tags what each thunk read (gather_tag, _core_schedule.pxi)

    def __call__(self):
        cdef Runtime rt = <Runtime>current()
        own = ahead_open(rt)   # no pass runs work ahead already: this gather does, in rounds
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
                    ahead_round(rt, rounds)
        finally:
            rt._gathering(-1)
            if own:
                ahead_close(rt)

    def each(self):
        cdef Runtime rt = <Runtime>current()
        lending = None
        if len(self.thunks) > 1 and lend_wanted(rt) and not (
                rt.prefetch is not None and rt.prefetch.is_worker()):
            # every thunk but the first runs in a worker thread meanwhile (plain cells
            # computed there; _core_schedule.pxi); this thread does the first, then takes
            # the others' results in order, replaying their reads
            lending = lend_open(rt, list(self.thunks[1:]), True)
        try:
            return self._each(rt, lending)
        finally:
            if lending is not None:
                lend_close(rt, lending)

    def _each(self, Runtime rt, lending):
        out = []
        deferred = None
        cdef Py_ssize_t i = -1
        cdef Py_ssize_t k0 = 0
        frame = None        # the driver's running frame: what each thunk reads is tagged
        if _run_ahead and rt.max_workers != 1 and rt.executor is None and rt.frames and \
                rt.owner == PyThread_get_thread_ident() and not (
                rt.prefetch is not None and rt.prefetch.is_worker()):
            # (only where a demand could run its calls ahead: demand_ahead)
            frame = rt.frames[len(rt.frames) - 1]
            if (<Frame>frame).id == rt.quiet:
                frame = None    # (untracked: nothing is recorded)
        for t in self.thunks:
            i += 1
            if frame is not None:
                k0 = len((<Frame>frame).reads)
            try:
                if i and lending is not None:
                    out.append(_lent_thunk(rt, lending, i - 1, t))
                    continue
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
                    raise deferred     # the work to run ahead comes first; this raises again
                if isinstance(deferred, _Suspend):
                    _aio_mod().abandon(current(), deferred.works)   # an interrupt: dropped
                raise
            finally:
                if frame is not None:
                    gather_tag(rt, frame, k0, (self.gid, i))
        if deferred is not None:
            raise deferred
        for i in range(len(out)):
            if inspect.isawaitable(out[i]):
                # a coroutine is never a value: every one is closed, and the thunk is named
                for v in out:
                    if inspect.iscoroutine(v):
                        v.close()
                t = self.thunks[i]
                raise TypeError(f"incr.gather(): thunk {i} "
                                f"({getattr(t, '__qualname__', None) or t!r}) returned "
                                f"{type(out[i]).__name__} {out[i]!r:.60}, not a value; a "
                                f"coroutine is never a value -- from async code use "
                                f"asyncio.gather, or make the thunk return a cell's value")
        return out


cdef object _lent_thunk(Runtime rt, object lending, Py_ssize_t i, object t):
    # a gather's thunk that was lent to a worker: its value, its reads replayed into the
    # running frame (they are this computation's reads, as if it had called the thunk); or,
    # when the worker stopped or what it read moved on, the thunk called here
    out = lending.wait(i)
    if out is None or out[0] == "missing" or not lend_fresh(rt, <list>out[2], <dict>out[3]):
        return t()
    kind, payload, log, cells = out
    for n, at in log:
        if at == -1 or at is None and (<tuple>cells[n])[0] != "ok":
            try:
                rt._read(n)          # it raised in the worker too, and the thunk caught it
            except Exception:
                pass
        else:
            rt._read(n)
    for n, at in log:
        if at is None and (<tuple>cells[n])[0] == "ok" and \
                not _same_value((<Node>n).value, (<tuple>cells[n])[1]):
            return t()               # came out otherwise here: not deterministic
    if kind == "error":
        raise payload
    return payload


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
