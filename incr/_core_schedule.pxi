# Running ahead (the engine side): the one mechanism by which a pass hands work to be done
# concurrently -- sync LLM generator and validator calls in worker threads, stale cells on an
# executor (Dask, Ray) -- and takes the results in its next round. One name for it: "run
# ahead". Its parts:
#   rt.prefetch      the pass's incr.remote.Ahead while one is open (stabilize, or a top-level
#                    incr.gather), else None; incr.llmnodes and incr.remote hand it the work
#   _Deferred        (incr.errors) unwinds a run whose work now runs ahead; fail() marks it
#   F_AHEAD          on an instance whose run runs ahead this pass, or that reads one
#   rt.ahead_marked  the instances marked F_AHEAD, cleared between rounds
#
# Contract:
#   - only between ahead_start/ahead_open and ahead_close is rt.prefetch set and may any
#     instance be F_AHEAD; ahead_round and ahead_close clear every F_AHEAD mark, so outside a
#     pass none is set (I6);
#   - an instance marked F_AHEAD keeps its value, dependencies and stamps; nothing hands its
#     old value out (ensure raises _Deferred), and whatever reads it is marked and waits;
#   - a round runs everything handed over at once; after 32 rounds, or when nothing could run,
#     the Ahead is stopped and the rest of the pass is serial.
# The threads, the executor and the replay of logged reads are incr.remote's.


cdef inline bint ahead_possible(Runtime rt):
    # whether anything could run ahead: an LLM node exists (and worker threads are allowed),
    # or an executor is set
    return (_run_ahead and rt.max_workers != 1) or rt.executor is not None


cdef inline void ahead_clear(Runtime rt):
    # unmark every instance marked F_AHEAD (between rounds, and at the end)
    cdef Instance m
    for m in rt.ahead_marked:
        m.flags &= ~F_AHEAD
    rt.ahead_marked = []


cdef void ahead_start(Runtime rt) except *:
    # a stabilize pass begins: it runs work ahead if anything could
    if ahead_possible(rt):
        from incr import remote as _remote
        rt.prefetch = _remote.Ahead(rt)
    rt.ahead_marked = []


cdef bint ahead_open(Runtime rt) except -1:
    # a top-level incr.gather begins: it runs work ahead in its own rounds, unless a pass
    # already does (stabilize) or nothing could run ahead (then False)
    if rt.prefetch is not None or not ahead_possible(rt):
        return False
    ahead_start(rt)
    return True


cdef void ahead_round(Runtime rt, int rounds) except *:
    # between rounds: unmark, run what was handed over concurrently (the pass or gather then
    # runs again and takes the results)
    ahead_clear(rt)
    if not rt.prefetch.run() or rounds > 32:
        rt.prefetch.stop()      # nothing to run ahead: the next round is serial


cdef void ahead_close(Runtime rt):
    # the pass or gather ends (normally or not)
    rt.prefetch = None
    ahead_clear(rt)


cdef int ahead_ship(Runtime rt, Instance m, list stack, list idx) except -1:
    # m must be (re)computed and an executor may run it (attempt checked: a pass or top-level
    # gather runs work ahead, rt.executor is set, the cell is not local). DONE: it runs ahead
    # (m is marked F_AHEAD); PUSHED: a dependency its new branch reads was pushed first;
    # NOMATCH: m runs here now (with the executor's result if rt.remote is m).
    cdef int r
    cdef Node d
    # an executor runs it: with its result (reads replayed in run), or it runs ahead now.
    # What its new branch read beyond its last run's dependencies (the scan of m.deps
    # does not see it) is brought up to date first, as a local run would read it
    for d in rt.prefetch.extra.get(m, ()):
        if d.flags & F_AHEAD:
            m.flags |= F_AHEAD         # runs ahead in this pass: m waits with it
            rt.ahead_marked.append(m)
            return DONE
        if not isinstance(d, Instance) or not _needs_work(d):
            continue
        if d.flags & (F_VERIFYING | F_RUNNING) or (
                not (d.flags & F_HAS_VALUE) and d in rt.failed):
            # it failed in this pass, or m's new branch reads what is being verified
            # now: m runs here, and meets that where it reads it, as a local run would
            rt.prefetch.local.add(m)
            break
        m.flags |= F_MUST_RUN             # back on top of the stack, m runs
        d.flags |= F_VERIFYING
        stack.append(d)
        idx.append(0)
        return PUSHED
    r = rt.prefetch.ship(m)
    if r == 0:
        m.flags |= F_AHEAD
        rt.ahead_marked.append(m)
        return DONE
    if r == 2:
        # it read something it was not given: that is among its extra dependencies
        # now (or m runs here), and the run is sent again once it is up to date
        rt.prefetch.missing_node(m)
        return attempt(rt, m, stack, idx)
    if r == 1:
        rt.remote = m    # its run here takes the executor's result (attempt clears this)
    return NOMATCH
