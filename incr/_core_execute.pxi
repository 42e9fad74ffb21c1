# Execute: run an instance's function and record what it read (Salsa's execute). run_begin
# pushes a frame, run calls the function, run_end records the result -- the cutoff decision
# (backdate, _core_backdate.pxi), the new edges (rewire), the timestamps (raise_ts), the
# store record -- and fail records a run that raised.
#
# Invariants kept:
#   - a failed run keeps no value: value None, F_HAS_VALUE cleared (a change if it had one);
#     its partial reads are kept as edges, so a reader that caught the exception is made stale
#     when the cause changes; the exception is kept for the pass (rt.failed);
#   - a run unwound for async work (_Suspend, CancelledError) or whose work runs ahead
#     (_Deferred) records nothing: the instance keeps value, edges and stamps;
#   - I3: rewire keeps `dependents` the exact reverse of `deps`; I4: raise_ts puts n after its
#     dependencies and pushes its dependents after it (explicit stack); the trace stays
#     acyclic: an edge that closes a cycle is dropped there (drop_cycle_edges);
#   - a coroutine is never a value: a sync function that returns one fails with TypeError;
#   - no allocation per sync run: its Frame comes from rt.free_frames and goes back there when
#     nothing else holds it or its reads (a frame that escaped -- to incr.llm, to an async
#     step -- is left to the collector and never reused), with its reads emptied, so no read
#     of one run is seen by the next (after an exception or an interrupt too: a frame is
#     emptied again when it is taken); rt.frames is pushed and popped without shrinking its
#     item array (CPython frees it whenever a list drops below half full: 0 -> 1 -> 0 on
#     every top-level run).


cdef extern from "Python.h":
    ctypedef struct PyListObject:
        PyObject **ob_item
        Py_ssize_t allocated
    void Py_SET_SIZE(object o, Py_ssize_t n)
    Py_ssize_t _refcnt "Py_REFCNT"(PyObject *o)


cdef inline void frames_push(list l, Frame f) except *:
    cdef PyListObject *p = <PyListObject *>l
    cdef Py_ssize_t k = len(l)
    if k < p.allocated:
        Py_INCREF(f)
        p.ob_item[k] = <PyObject *>f
        Py_SET_SIZE(l, k + 1)
    else:
        l.append(f)


cdef inline void list_pop_keep(list l) noexcept:
    # (the same for a verification stack: its items are held by the instance tables)
    frames_pop(l)


cdef inline void frames_pop(list l) noexcept:
    # the last item out, the item array kept (list.pop frees it below half full); the
    # caller holds its own reference to the frame, so the decref frees nothing
    cdef PyListObject *p = <PyListObject *>l
    cdef Py_ssize_t k = len(l) - 1
    cdef PyObject *o = p.ob_item[k]
    Py_SET_SIZE(l, k)
    Py_DECREF(<object>o)


cdef inline void _list_empty(list l) noexcept:
    # l[:] = [], keeping the item array (l is held by one frame only: no one sees it)
    cdef PyListObject *p = <PyListObject *>l
    cdef Py_ssize_t i, k = len(l)
    Py_SET_SIZE(l, 0)
    for i in range(k):
        Py_DECREF(<object>p.ob_item[i])


cdef Frame frame_take(Runtime rt, Instance n):
    # a frame for a sync run of n: pooled if one is free, else new; a fresh id either way
    cdef Frame f = rt.free_frames
    if f is None:
        return new_frame(rt, n)
    rt.free_frames = f.next_free
    f.next_free = None
    if len(f.reads):
        _list_empty(f.reads)
    rt.frame_ids += 1
    f.node = n
    f.id = rt.frame_ids
    return f


cdef void frame_give(Runtime rt, Frame f) noexcept:
    # f's run is over: back to the pool when only the caller holds it and its reads
    if _refcnt(<PyObject *>f) != 1 or _refcnt(<PyObject *>f.reads) != 1:
        return       # (1: the caller's variable; the argument is borrowed)
    if len(f.reads):
        _list_empty(f.reads)
    f.node = None
    f.next_free = rt.free_frames
    rt.free_frames = f


cdef inline Frame new_frame(Runtime rt, Instance n):
    cdef Frame f
    rt.frame_ids += 1
    f = Frame.__new__(Frame)
    f.node = n
    f.reads = []
    f.id = rt.frame_ids
    return f


cdef Frame run_begin(Runtime rt, Instance n):
    # push n's frame and mark it running (an async cell's run: run_async, incr._aio)
    cdef Frame f = frame_take(rt, n)
    if not rt.frames:
        rt.owner = PyThread_get_thread_ident()
    rt.frames.append(f)
    n.flags = (n.flags | F_RUNNING) & ~F_INVALID
    return f


@cython.boundscheck(False)
@cython.wraparound(False)
cdef bint run(Runtime rt, Instance n) except -1:
    cdef Frame f
    cdef bint had = (n.flags & F_HAS_VALUE) != 0
    cdef object value
    if n.cell.is_async:
        # an async cell: its first step here (_core_async.pxi); if it has to wait, it goes
        # on on this thread's event loop (sync code), or, inside a running loop, unwinds to
        # the nearest await, which runs it (incr._aio)
        return run_async(rt, n)
    cdef Py_ssize_t unwinding = len(rt.unwinding) if _async_defined else 0
    cdef list frames = rt.frames
    f = frame_take(rt, n)
    if not frames:
        rt.owner = PyThread_get_thread_ident()
    frames_push(frames, f)
    n.flags = (n.flags | F_RUNNING) & ~F_INVALID
    try:
        if rt.remote is n:
            value = rt.prefetch.take(n)   # an executor's result; its reads replayed
        elif n.fresh_args:
            value = n.cell.invoke(_keys.own_args(n.args))   # a copy it may mutate
        else:
            value = n.cell.invoke(n.args)
        if _async_defined and len(rt.unwinding) > unwinding:
            # the function caught the unwinding for async work (an `except BaseException`
            # or a bare `except:`) and returned: its value may rest on a failure that was
            # not one. Not kept: the unwinding goes on, and it runs again after the work
            works = rt.unwinding[unwinding:]
            del rt.unwinding[unwinding:]
            raise _Suspend(works)
    except BaseException as e:
        frames_pop(frames)
        fail(rt, n, f.reads, had, e, "raised in cell")
        frame_give(rt, f)
        raise
    frames_pop(frames)
    run_end(rt, n, f, had, value)
    frame_give(rt, f)
    return True


@cython.boundscheck(False)
@cython.wraparound(False)
cdef bint run_end(Runtime rt, Instance n, Frame f, bint had, object value) except -1:
    # record a finished run of n (its frame already popped): cutoff, edges, stamps, store
    cdef bint same
    if type(value) is _CoroutineType or type(value) is _Await:
        value.close()   # never awaited: no "never awaited" warning, and never a value
        e = TypeError(f"{n.label()} returned a coroutine: the function is sync but "
                      f"returned an awaitable; await it inside the function, or make "
                      f"the function return the value. A coroutine is never a value.")
        fail(rt, n, f.reads, had, e, "raised in cell")
        raise e
    n.flags &= ~F_RUNNING
    same = False
    if had:
        try:
            same = backdate(n, value)
        except BaseException as e:
            fail(rt, n, f.reads, had, e, "raised in the cutoff of cell")
            raise
    rewire(rt, n, n.deps, f.reads)
    if not same:
        n.vhash = None
    if same:
        n.last_action = A_CUTOFF
        rt.n_cutoff += 1
        rt.n_recomputed += 1
    else:
        n.value = value
        n.changed_at = rt.clock
        n.changed_rev = rt.revision
        if had:
            n.last_action = A_RECOMPUTED
            rt.n_recomputed += 1
        else:
            n.last_action = A_COMPUTED
            n.why = None
            rt.n_computed += 1
    n.verified_at = rt.clock
    n.ran_rev = rt.revision
    n.flags = (n.flags | F_HAS_VALUE) & ~F_DIRTY
    raise_ts(rt, n)
    if rt.store is not None:
        try:
            record(rt, n)
        except Exception as e:  # persistence is best effort: the value stays in memory
            _warn_once(n.cell, f"incr: {n.label()} could not be stored ({e!r})")
    if rt.report_log is not None:
        rt.report_log.append((n, n.last_action))
    return True


cdef void fail(Runtime rt, Instance n, list reads, bint had, BaseException e, str where) except *:
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
        # -- its work runs ahead (_core_schedule.pxi) ---------------------------------------
        # Not a failure: stabilize runs the work ahead and this run starts again in the
        # next pass. It leaves nothing behind: n keeps its value, dependencies and stamps,
        # stays stale, and waits (F_AHEAD), as does whatever reads it.
        n.flags = (n.flags & ~F_RUNNING) | F_AHEAD
        rt.ahead_marked.append(n)
        if n.observed_by is not None:
            rt.dirty_observed.append(n)
        return
    n.flags &= ~(F_RUNNING | F_HAS_VALUE | F_DIRTY)
    rewire(rt, n, n.deps, reads)
    n.value = None
    n.vhash = None
    if had:  # losing a value is a change; failing again is not
        n.changed_at = rt.clock
        n.changed_rev = rt.revision
    n.verified_at = rt.clock
    n.ran_rev = rt.revision
    n.last_action = A_FAILED
    rt.failed[n] = e
    rt.n_failed += 1
    if n.observed_by is not None:
        rt.dirty_observed.append(n)
    raise_ts(rt, n)
    if not getattr(e, "_incr_noted", False):
        chain = " <- ".join([(<Frame>x).node.label() for x in reversed(rt.frames)])
        _add_note(e, f"incr: {where} {n.label()}" + (f", called from {chain}" if chain else ""))
        try:
            e._incr_noted = True
        except Exception:
            pass
    if rt.report_log is not None:
        rt.report_log.append((n, A_FAILED))


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void rewire(Runtime rt, Instance n, tuple old, list new):
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


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void raise_ts(Runtime rt, Instance n):
    # keep I4: n after all its deps; then every dependent after n, transitively
    cdef Node d
    cdef Instance m
    cdef long long top = 0
    for d in n.deps:
        if d.ts > top:
            top = d.ts
    if n.ts > top:
        return
    rt.ts_clock += 1
    n.ts = rt.ts_clock
    if n.dependents is None:
        return
    cdef list stack = [n]
    while stack:
        d = <Node>stack.pop()
        if d.dependents is None:
            continue
        for m in d.dependents:
            if m.ts <= d.ts:
                if m is n:
                    # a path from n back to n: n read what reads it (an async run's read
                    # of an instance that was not on its stack then, which met n): the edges
                    # into the cycle go (as a sync read's is never made), and d is done again
                    drop_cycle_edges(rt, n)
                    stack.append(d)
                    break
                rt.ts_clock += 1
                m.ts = rt.ts_clock
                stack.append(m)


cdef void drop_cycle_edges(Runtime rt, Instance n):
    # (the cold path of raise_ts) n's dependencies from which n is reached again go
    cdef Node d
    cdef list keep = []
    for d in n.deps:
        if not _reaches(d, n):
            keep.append(d)
    rewire(rt, n, n.deps, keep)


cdef bint _reaches(Node start, Instance n):
    # n is a transitive dependency of start (an explicit stack: depth is no recursion)
    cdef Node d, e
    cdef set seen = set()
    cdef list todo = [start]
    while todo:
        d = <Node>todo.pop()
        if d is n:
            return True
        if not isinstance(d, Instance) or d in seen:
            continue
        seen.add(d)
        for e in (<Instance>d).deps:
            todo.append(e)
    return False
