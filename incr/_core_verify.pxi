# Verify: bring one instance up to date without recursion (Salsa's maybe_changed_after, on
# an explicit stack). ensure() walks the recorded dependencies in read order; the first one
# found changed (changed_at > verified_at) makes the instance run -- attempt(): from the
# store if a stored trace matches (_core_store.pxi), through an executor when one runs work
# ahead (_core_schedule.pxi), else here (run_in_stack, _core_execute.pxi). An instance whose
# dependencies all check out is marked verified without running (A_REUSED).
#
# Invariants kept:
#   - every stale instance runs at most once per pass; after ensure(n), n is clean at the
#     current clock (I1, I2) or marked F_AHEAD (then _Deferred is raised, never the old value);
#   - Salsa's order when shallow: dependencies after the changed one are not touched before
#     the run (a branch the new run no longer takes is never brought up to date); deeper than
#     DEEP frames, dependencies first (no recursion proportional to depth);
#   - on any exception, F_VERIFYING and F_MUST_RUN are cleared on everything on the stack and
#     a lookup in progress is dropped (Persist.cands/resolved None): lookup state is empty
#     outside a lookup, pass-only flags are clear outside a pass;
#   - the walk's position in an instance's dependencies is the instance's own C field
#     (walk_at, no boxed index list): it is 0 whenever the instance is on no verification
#     stack (reset when it leaves one, normally or by an exception), so whoever pushes an
#     instance (here, probe_step, ahead_ship) starts its scan at its first dependency. An
#     instance is on at most one stack at a time (F_VERIFYING is checked before a push).


cdef inline bint _needs_work(Node n):
    return (n.flags & (F_DIRTY | F_HAS_VALUE)) != F_HAS_VALUE


@cython.boundscheck(False)
@cython.wraparound(False)
cdef inline int _scan_shallow(Instance m) noexcept:
    # ensure()'s scan of m's dependencies, in read order, when nothing else is on the stack:
    # 1 when the first one that decides is changed or failed (m.why set: m must run), 0 when
    # none is (m is up to date), -1 when the first one that decides is dirty or runs ahead
    # (the walk in ensure() brings it up to date first). Changes nothing else.
    cdef tuple deps = m.deps
    cdef Node d
    cdef Py_ssize_t i
    for i in range(len(deps)):
        d = <Node>deps[i]
        if d.flags & (F_AHEAD | F_DIRTY):
            if (d.flags & F_AHEAD or (d.flags & (F_DIRTY | F_HAS_VALUE))
                    == (F_DIRTY | F_HAS_VALUE)):
                return -1
        if not (d.flags & F_HAS_VALUE) or d.changed_at > m.verified_at:
            m.why = d
            return 1
    return 0


@cython.boundscheck(False)
@cython.wraparound(False)
cdef object ensure(Runtime rt, Instance n):
    # Bring n up to date. Recorded dependencies are walked with an explicit stack, so the
    # depth of the graph never becomes depth of the C or Python stack.
    cdef list stack = rt.spare_stack
    cdef Instance m
    cdef Node d
    cdef tuple deps
    cdef Py_ssize_t i, nd
    cdef bint pushed, must_run
    cdef int r
    if n.flags & F_AHEAD:
        raise _Deferred(n.label())    # runs ahead in this pass: whatever reads it waits
    if ((n.flags & (F_DIRTY | F_HAS_VALUE | F_MUST_RUN | F_INVALID)) == (F_DIRTY | F_HAS_VALUE)
            and rt.store is None and rt.prefetch is None and rt.executor is None
            and len(rt.frames) < DEEP):
        # The shallow case, without the stack: n's first decisive dependency is clean. It is
        # what the walk below does for n alone (the same scan, in read order); a dirty or
        # running-ahead dependency before a changed one needs the walk (_scan_shallow: -1).
        i = _scan_shallow(n)
        if i == 0:
            n.flags &= ~F_DIRTY
            n.verified_at = rt.clock
            n.last_action = A_REUSED
            rt.n_reused += 1
            return n.value
        if i == 1:
            n.flags |= F_VERIFYING
            if rt.gathered is not None:
                rt.gathered.pop(n, None)      # what its last run gathered: the new run says
            try:
                run(rt, n)            # (attempt() without a store or an executor)
            except BaseException:
                n.flags &= ~(F_VERIFYING | F_MUST_RUN)
                rt.remote = None
                raise
            rt.remote = None
            n.flags &= ~F_VERIFYING
            if n.flags & F_AHEAD:
                raise _Deferred(n.label())
            return n.value
    if stack is not None:
        # the list of the last ensure that finished (empty): no allocation per demand. A
        # nested ensure finds the slot empty and makes its own.
        rt.spare_stack = None
        stack.append(n)
    else:
        stack = [n]
    n.flags |= F_VERIFYING
    try:
        while stack:
            m = <Instance>stack[len(stack) - 1]
            if m.persist is not None and m.persist.cands is not None:
                # a store lookup in progress: a dependency it pushed is now up to date
                if attempt(rt, m, stack) == PUSHED:
                    continue
            elif not _needs_work(m):
                pass
            elif not (m.flags & F_HAS_VALUE):
                if attempt(rt, m, stack) == PUSHED:
                    continue
            else:
                i = m.walk_at
                deps = m.deps
                nd = len(deps)
                pushed = False
                must_run = (m.flags & (F_MUST_RUN | F_INVALID)) != 0
                while i < nd:
                    d = <Node>deps[i]
                    if rt.demand_ahead == 2 and m.flags & F_AHEAD:
                        # a demand's run-ahead: past what m waits for, only other thunks'
                        # reads of the same gather (_core_schedule.pxi, ahead_scan)
                        r = ahead_scan(rt, m, d)
                        if r == 2:
                            break
                        if r == 1:
                            i += 1
                            continue
                    if d.flags & F_AHEAD:
                        # its run runs ahead in this pass: m waits for the next round, and
                        # the scan goes on, so that independent work after it runs ahead
                        # together (model calls at once, cells shipped together); a
                        # dependency known to have changed still stops it below (Salsa's
                        # order: m's new run may no longer read what comes after).
                        # m is listed in rt.ahead_marked as it is marked, not when its scan
                        # ends: a walk unwound before that (async work, _Suspend) would
                        # leave a mark no round clears (seed 61: the pass looped for good)
                        if not (m.flags & F_AHEAD):
                            m.flags |= F_AHEAD
                            rt.ahead_marked.append(m)
                        if rt.demand_ahead == 2 and not ahead_wait(rt, m, d):
                            break
                        i += 1
                        continue
                    if (d.flags & (F_DIRTY | F_HAS_VALUE)) == (F_DIRTY | F_HAS_VALUE):
                        if rt.inflight and elsewhere(rt, d):
                            raise _Suspend([_aio_mod().Wait(d)])   # another task runs it
                        if d.flags & (F_VERIFYING | F_RUNNING):
                            raise CycleError(cycle_labels(rt, <Instance>d, stack, m)
                                             or [m.label(), _node_label(d), m.label()])
                        if rt.demand_ahead == 1:
                            ahead_trigger(rt, m, d)   # gathered: walk again, run-ahead open
                        m.walk_at = <int>i
                        d.flags |= F_VERIFYING
                        stack.append(d)
                        pushed = True
                        break
                    if not must_run and (not (d.flags & F_HAS_VALUE)
                                         or d.changed_at > m.verified_at):
                        # d failed last time, or changed: m must run
                        must_run = True
                        m.why = d
                        if len(rt.frames) < DEEP and rt.executor is None:
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
                if m.flags & F_AHEAD:
                    pass        # waits: neither run nor verified now (listed when marked)
                elif must_run:
                    m.flags &= ~F_MUST_RUN
                    if attempt(rt, m, stack) == PUSHED:
                        continue
                else:
                    m.flags &= ~F_DIRTY
                    m.verified_at = rt.clock
                    m.last_action = A_REUSED
                    rt.n_reused += 1
            m.flags &= ~F_VERIFYING
            m.walk_at = 0
            list_pop_keep(stack)     # (list.pop would free the item array at 0)
    except BaseException:
        for m in stack:
            m.flags &= ~(F_VERIFYING | F_MUST_RUN)
            m.walk_at = 0
            if m.persist is not None:
                m.persist.cands = None
                m.persist.resolved = None
        raise      # (the list is dropped: the next ensure makes a new one)
    rt.spare_stack = stack
    if n.flags & F_AHEAD:
        raise _Deferred(n.label())    # it waits: its old value is not the answer
    return n.value


cdef int attempt(Runtime rt, Instance m, list stack) except -1:
    # m must be (re)computed: take it from the store if a stored trace of it matches the
    # current dependencies, else run it. Returns PUSHED when a dependency was pushed.
    cdef int r
    cdef int invalid = m.flags & F_INVALID
    cdef Node d
    if rt.store is not None and not (m.flags & F_INVALID):
        r = probe_step(rt, m, stack)
        if r != NOMATCH:
            return r
    if rt.lent is not None and m in rt.lent and lend_take(rt, m):
        pass   # a worker thread ran it: run() takes that run (_core_schedule.pxi)
    elif rt.prefetch is not None and rt.executor is not None and not m.cell.local \
            and (not rt.frames or rt.gathering):
        r = ahead_ship(rt, m, stack)   # an executor runs it (_core_schedule.pxi)
        if r != NOMATCH:
            return r
    tags = None
    if rt.gathered is not None:
        tags = rt.gathered.pop(m, None)   # what its last run gathered: the new run says
    try:
        run_in_stack(rt, m, len(stack) == 1)
    except _Deferred as e:
        # its work runs ahead (fail() keeps its value and stamps): a withdrawn instance
        # stays withdrawn, so that the next pass runs it instead of reusing that value
        if tags is not None:
            rt.gathered[m] = tags         # (nothing recorded: its dependencies stand)
        m.flags |= invalid
        if len(stack) > 1 and m.flags & F_AHEAD and type(e) is _Deferred:
            return DONE   # a dependency verified for its reader: the reader waits with it
        raise
    finally:
        rt.remote = None
    return DONE


cdef bint run_in_stack(Runtime rt, Instance m, bint bottom) except -1:
    # Run m from a verification stack. A failure of an instance that is not the one
    # demanded is kept for this pass (rt.failed): its dependent then re-runs and meets
    # the same exception where it reads it, exactly as a from-scratch run would.
    if bottom:
        run(rt, m)
        return True
    try:
        run(rt, m)
    except Exception:
        return False
    return True
