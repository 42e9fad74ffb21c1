# Demand: a cell instance's value, asked for by a call (top level or inside a running
# computation). Like Salsa's fetch_hot/fetch_cold: the hit path, demand() (who may read now,
# the read recorded, a clean instance's value), is a few flag tests; everything else is
# demand_cold(): cycles, another task's run, the pass's failures, then ensure()
# (_core_verify.pxi) -- at top level inside enter()/leave() and settle(), which commits to
# the store once.
# Also the instance table (lookup, table_for), read recording, and the pass bracket.
#
# Invariants kept:
#   - a read is recorded once per frame (read_stamp) and never for an instance on the stack
#     (an edge into a cycle is never recorded): I3 stays exact;
#   - the value handed out is clean (I1, I2), never F_AHEAD's old value, never a failed run's;
#   - enter()/leave() bracket every top-level demand and stabilization: one thread computes
#     at a time (busy_thread), and inputs set by other threads meanwhile are applied by
#     leave() in order, as the next revision (apply_pending);
#   - a failed instance is re-raised within a pass (rt.failed), run again in the next one.


cdef Instance lookup(Runtime rt, Cell c, dict table, tuple bound, bint create):
    # the instance of c for these bound arguments (created if asked), or None.
    # TypeError, naming the cell and the argument, if an argument cannot be keyed.
    cdef object owned = None
    key = _fast_key(bound)
    cdef bint fast = key is not None
    if not fast:
        key = normalize_args(c.qualname_label, c.param_names, bound)
    n = table.get(key)
    if n is None and create:
        check_usable(rt)
        if not fast:    # (str, int and None need no copy)
            owned = _keys.own_args(bound)   # the instance never shares the caller's objects
        if owned is None:
            n = new_instance(c, bound, rt)
        else:
            n = new_instance(c, <tuple>owned, rt)
            (<Instance>n).fresh_args = True
        table[key] = n
    return n


cdef inline Instance new_instance(Cell c, tuple args, Runtime rt):
    # Instance(c, args, rt) without the type call and __init__'s argument parsing: tp_new
    # gives None in every object field and 0 in every C field (why, observed_by, persist,
    # fresh_args, walk_at, the stamps; A_NONE is 0), and Node's __cinit__ runs as before
    cdef Instance n = Instance.__new__(Instance)
    n.cell = c
    n.args = args
    n.rt = rt
    n.deps = ()
    return n


cdef dict table_for(Runtime rt, Cell cell):
    cdef dict t = rt.tables.get(cell)
    if t is None:
        t = {}
        rt.tables[cell] = t
    return t


cdef inline void record_read(Runtime rt, Node n):
    cdef Frame f = <Frame>rt.frames[len(rt.frames) - 1]
    if n.read_stamp != f.id and f.id != rt.quiet:
        n.read_stamp = f.id
        f.reads.append(n)


cdef inline void record_into(Runtime rt, Frame f, Node n):
    if n.read_stamp != f.id:
        n.read_stamp = f.id
        f.reads.append(n)


cdef object demand(Runtime rt, Instance n):
    # The hit path: who may read now, the read recorded, and a clean instance's value;
    # anything else goes to demand_cold.
    if rt.prefetch is not None and rt.prefetch.reading and rt.prefetch.is_worker():
        # a generator running ahead in a worker thread (stabilize with max_workers, or an
        # incr.gather): it may read what is up to date; anything else waits for the pass
        if (n.flags & (F_DIRTY | F_HAS_VALUE | F_RUNNING | F_VERIFYING)) == F_HAS_VALUE:
            rt.prefetch.read(n)
            return n.value
        return rt.prefetch.worker_demand(n)   # computed here, or the run stops (_Deferred)
    elif rt.frames:
        if PyThread_get_thread_ident() != rt.owner:
            raise IncrError(rt._other_thread())
        if _effects_defined and (<Frame>rt.frames[len(rt.frames) - 1]).node.cell.is_effect:
            return demand_for_effect(rt, n)
        if not (n.flags & (F_RUNNING | F_VERIFYING)):
            record_read(rt, n)  # (an edge into a cycle is never recorded)
    elif other_busy(rt):
        raise IncrError(rt._other_thread())   # another thread's demand or stabilize
    elif not rt.stabilizing:
        if rt.closed:
            check_usable(rt)
        if rt.failed and not rt.keep_failed:
            rt.failed.clear()  # a new top-level pass: failed instances run again
        if rt.llm is not None and (rt.llm.spot or rt.llm.halted):
            # LLM nodes with recheck_every= whose spot check is due are withdrawn first, as
            # at the start of stabilize(): a node demanded without an observer is checked
            # too; and after rt.resume(), what met a halted node is made stale
            from incr import llmnodes as _llm
            _llm.spot_checks(rt)
    if (n.flags & (F_DIRTY | F_HAS_VALUE | F_RUNNING | F_VERIFYING)) == F_HAS_VALUE:
        return n.value
    return demand_cold(rt, n)


cdef object demand_for_effect(Runtime rt, Instance n):
    # A read by a running @incr.effect: n's value is handed over only if every LLM node it
    # rests on (n itself, or any instance it depends on, transitively) is stable -- accepted
    # with evidence, not "unvalidated"; otherwise IncrError, and the effect's run fails (it
    # runs again at its next demand). The read is recorded either way, so the effect is
    # stale again when what it read changes.
    if not (n.flags & (F_RUNNING | F_VERIFYING)):
        record_read(rt, n)
    if (n.flags & (F_DIRTY | F_HAS_VALUE | F_RUNNING | F_VERIFYING)) == F_HAS_VALUE:
        value = n.value
    else:
        value = demand_cold(rt, n)
    from incr import llmnodes as _llm
    _llm.effect_read(rt, (<Frame>rt.frames[len(rt.frames) - 1]).node, n)
    return value


cdef object demand_cold(Runtime rt, Instance n):
    # The cold path: n is stale, has no value, or is on the stack (a cycle, or another task's
    # run). Nested or inside a pass: ensure(). At top level: a pass of its own (enter, settle
    # with one store commit, leave).
    cdef Py_ssize_t i
    if n.flags & (F_RUNNING | F_VERIFYING) and rt.inflight and elsewhere(rt, n):
        raise _Suspend([_aio_mod().Wait(n)])       # another task runs it: wait for it
    if n.flags & (F_RUNNING | F_VERIFYING):        # (elsewhere() drops dead-loop work)
        labels = [(<Frame>f).node.label() for f in rt.frames]
        start = 0
        for i in range(len(rt.frames)):
            if (<Frame>rt.frames[i]).node is n:
                start = i
                break
        raise CycleError(cycle_labels(rt, n, None, None)
                         or (labels[start:] + [n.label()] if n.flags & F_RUNNING
                             else [n.label()] + labels[start:] + [n.label()]))
    if not (n.flags & F_HAS_VALUE) and n in rt.failed:
        raise rt.failed[n]
    if rt.frames or rt.stabilizing:
        return ensure(rt, n)
    cdef bint in_loop = _async_defined and _loop_running()
    enter(rt)
    if in_loop:
        _aio_mod()._op_began()   # sync code on a running loop: a sync cell's calls of async
                                 # cells return values here (not awaitables)
    try:
        return settle(rt, n, None)
    except _Suspend as s:
        if rt.catching:
            raise
        _aio_mod().abandon(rt, s.works)
        raise IncrError(_SUSPEND_MSG.format(what=n.label())) from None
    finally:
        if in_loop:
            _aio_mod()._op_ended()
        leave(rt)


cdef object settle(Runtime rt, Instance n, object body):
    # A top-level demand of n, or body() (incr.gather at top level): one store commit for
    # everything it computed; an incr.Reject that escapes withdraws the blamed candidate
    # and it runs again.
    cdef int rejects = 0
    while True:
        try:
            v = demand_ahead(rt, n) if body is None else body()   # (_core_schedule.pxi)
            break
        except Reject as e:
            if rejects < MAX_REJECTS and absorb_reject(rt, e):
                rejects += 1
                continue
            if rt.store is not None:
                flush(rt, True)
            raise
        except BaseException:
            if rt.store is not None:
                flush(rt, True)   # what finished is kept (a _Suspend: the rest runs again)
            raise
    if rt.store is not None:
        flush(rt, False)
    return v

# -- incr.gather's own rounds (no pass is gathering work already) ------------------------


cdef bint absorb_reject(Runtime rt, BaseException e) except -1:
    # an incr.Reject reached the top: record its NACK and withdraw the blamed candidate
    # (incr.llm decides whether it applies); True when the computation should run again
    from incr import llmnodes as _llm
    inst = _llm._absorb_reject(rt, e)
    if inst is None:
        return False
    invalidate(rt, <Instance>inst)
    rt.failed.clear()
    return True


cdef void check_usable(Runtime rt) except *:
    if rt.closed:
        if rt.forked_mid_run is not None:
            raise IncrError(rt.forked_mid_run)
        raise IncrError("this incr.Runtime is closed; create a new one")


cdef inline bint other_busy(Runtime rt):
    # another thread is in a top-level demand or stabilize of this runtime
    # (or holds an open batch: Runtime._batch_enter)
    return ((rt.busy_depth and rt.busy_thread != PyThread_get_thread_ident())
            or (rt.batch_thread != 0 and rt.batch_thread != PyThread_get_thread_ident()))


cdef bint elsewhere(Runtime rt, Node n):
    # n is an async instance whose run is in flight in another task (not on this stack)
    cdef object f
    if not (n.flags & F_RUNNING) or n not in rt.inflight:
        return False
    for f in rt.frames:
        if (<Frame>f).node is n:
            return False
    # work pinned to a closed event loop is dropped (n stale, not running): run it again
    return not _aio_mod().dead(rt, n)

# -- hooks of incr._aio (async cells and calls; the loop's thread only) ------------------


cdef void enter(Runtime rt) except *:
    # a top-level demand or stabilize begins: one thread at a time. Check and claim run
    # with no Python call in between, so under the GIL no other thread slips in.
    if other_busy(rt):
        raise IncrError(rt._other_thread())
    if rt.closed:
        check_usable(rt)
    rt.busy_thread = PyThread_get_thread_ident()
    rt.busy_depth += 1


cdef void leave(Runtime rt):
    if rt.pending_sets and rt.busy_depth == 1:
        apply_pending(rt)
    rt.busy_depth -= 1
    if rt.busy_depth == 0:
        rt.busy_thread = 0
        if INCR_DEBUG and not rt.closed:
            debug_check(rt)


cdef void debug_check(Runtime rt):
    # The debug build only: the invariants after a top-level operation, or abort.
    try:
        check(rt)
    except AssertionError as e:
        import sys, traceback
        sys.stderr.write("incr (debug build): an invariant is broken after a top-level "
                         f"operation:\n{e}\n")
        traceback.print_stack(file=sys.stderr)
        sys.stderr.flush()
        abort()


cdef void apply_pending(Runtime rt):
    # changes other threads made during the pass: the next revision, applied in the order
    # they were made, before another thread may claim the runtime
    cdef Input inp
    while rt.pending_sets and not rt.closed:
        inp, value = rt.pending_sets.pop(0)
        if inp is None:          # an operation of several sets (defer_op): made now
            try:
                value()
            except Exception as e:
                _warnings.warn(f"incr: a change made during the pass could not be made after "
                               f"it ({e!r}); make it again", RuntimeWarning)
            continue
        try:
            apply_set(rt, inp, value)
        except Exception as e:   # only a raising __eq__ of the value gets here
            _warnings.warn(f"incr: input {inp.name!r} could not be set after the pass "
                           f"({e!r}); set it again", RuntimeWarning)


cdef long long quiet_enter(Runtime rt):
    # reads of the innermost running frame stop being recorded; returns what to restore
    cdef long long old = rt.quiet
    if rt.frames and rt.owner == PyThread_get_thread_ident():
        # (only the thread computing here: in any other thread it changes nothing)
        rt.quiet = (<Frame>rt.frames[len(rt.frames) - 1]).id
    return old


cdef void owe(Runtime rt, list todo):
    # after an interrupted pass: the observers of what was brought up to date get their
    # callbacks from the next pass (what still needs work is queued by the pass itself)
    cdef Instance n
    cdef Observer o
    for n in todo:
        if n.observed_by is not None and not _needs_work(n):
            for o in n.observed_by:
                if n.flags & F_HAS_VALUE:
                    o.error = None      # (the error of an earlier run no longer holds)
                if o.seen_at != n.changed_at:
                    rt.unnotified.append(o)
