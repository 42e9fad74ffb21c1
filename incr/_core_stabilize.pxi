# Stabilize: one stabilization pass (Jane Street's stabilize, in Salsa's order). The dirty
# observed instances are brought up to date in timestamp order (ensure); work that runs ahead
# is run between rounds (ahead_round) and the pass runs again -- inside a running loop the
# round is detached instead (ahead_detach: the pass unwinds and astabilize awaits it); an incr.Reject withdraws the
# blamed candidate and the pass runs again (at most MAX_REJECTS); then the callbacks of the
# observers whose value changed run, once, outside the trace.
#
# Invariants kept:
#   - no callback sees a mix of old and new values: callbacks run after everything is up to
#     date; an interrupt owes the callbacks not yet called to the next pass (rt.unnotified);
#   - I5 at the end: every observed instance not up to date (stale, failed, interrupted) is
#     back in rt.dirty_observed;
#   - pass-only state is cleared on every exit: stabilizing, report_log, rt.prefetch and every
#     F_AHEAD mark (ahead_close); the store is flushed once per pass.
#
# Its own cost, with one changed input and nobody listening (no rt.on_event, progress or
# otel): the clock is read in C (two vDSO calls, not time.perf_counter), the context variable
# is set only when another runtime (or none) is active, and the report is a compiled object
# whose labels are built when first read.


from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC
from cpython.contextvars cimport PyContextVar_Set, PyContextVar_Reset


cdef inline double _now() noexcept nogil:
    # time.perf_counter()'s clock on Linux (CLOCK_MONOTONIC), without a Python call
    cdef timespec t
    clock_gettime(CLOCK_MONOTONIC, &t)
    return <double>t.tv_sec + <double>t.tv_nsec * 1e-9


cdef object stabilize_pass(Runtime rt):
    cdef list todo = []
    cdef Instance n
    cdef Observer o
    cdef bint done = False
    cdef double t0 = _now()
    if rt.llm is not None and rt.llm.listeners:
        from incr import llmnodes as _llm
        _llm.pass_started(rt)
    if len(rt.dirty_observed) == 1:      # (one observed instance: no dedup, no sort)
        n = <Instance>rt.dirty_observed[0]
        if n.observed_by is not None:
            todo.append(n)
    else:
        for n in dict.fromkeys(rt.dirty_observed):  # once each, in the order queued
            if n.observed_by is not None:
                todo.append(n)
    _list_empty(rt.dirty_observed)       # (emptied in place: its item array is kept)
    if len(todo) > 1:
        todo.sort(key=_ts_key)
    cdef list errors = None      # (instance, exception) of those that raised (made when one does)
    log = []
    cdef long long reused0 = rt.n_reused
    # (inside `with rt:`, or a pass of rt.astabilize's, rt is active already: no new context)
    # (the C API, not the ContextVar.set/reset methods: no method lookup and call, ~400
    # instructions a pass outside `with rt:`)
    token = PyContextVar_Set(_active, rt) if get_value(_active) is not rt else None
    rt.stabilizing = True
    rt.report_log = log
    if rt.failed and not rt.keep_failed:
        rt.failed.clear()
    cdef list suspended = None   # async work met by this pass (created when met)
    cdef int rejects = 0
    cdef int rounds = 0
    lending = None
    try:
        ahead_start(rt)    # inside the try: an interrupt while it sets up still ends the pass
        if rt.prefetch is not None and rt.prefetch.wanted:
            ahead_wanted(rt)   # what the calls of a detached round stopped at, first
        while True:
            ahead = False
            # two or more observed instances that could run now: all but the first run in
            # worker threads meanwhile, and the walk below takes their runs where it would
            # run them (_core_schedule.pxi); one, or a chain, takes no thread
            lending = lend_pass(rt, todo) if len(todo) > 1 else None
            for n in todo:
                if n.flags & F_AHEAD:
                    ahead = True        # its work runs ahead, from earlier in this pass
                elif not (n.flags & F_HAS_VALUE) and n in rt.failed:
                    errors = _add_error(errors, n, rt.failed[n])  # failed earlier in this pass
                elif _needs_work(n):
                    try:
                        ensure(rt, n)
                    except _Suspend as s:
                        if suspended is None:      # async work: gathered, done at once
                            suspended = []
                        suspended.extend(s.works)
                    except _Deferred:
                        ahead = True
                    except Exception as e:
                        errors = _add_error(errors, n, e)
            if lending is not None:
                lend_close(rt, lending)
                lending = None
            if suspended:
                # inside a running event loop, observed instances need async work: the
                # pass stops here (nothing half-recorded) and rt.astabilize does the work
                # of all of them concurrently, then passes again (incr._aio)
                s = _Suspend(suspended)
                s.log = log          # the runs this pass made before it stopped: they stand,
                suspended = None     # and rt.astabilize reports them
                raise s
            if rt.ahead_marked:
                ahead = True
            if ahead:
                # generator calls and executor runs this pass met run ahead now,
                # concurrently; then the pass runs again and takes their results
                # (replaying what they read)
                rounds += 1
                works = ahead_detach(rt, rounds)
                if works is not None:
                    # inside a running loop: the calls run in worker threads while the loop
                    # runs; the pass stops here, rt.astabilize awaits their claims, then
                    # passes again and takes their outcomes (_core_schedule.pxi)
                    s = _Suspend(works)
                    s.log = log
                    raise s
                ahead_round(rt, rounds)
                errors = None
                rt.failed.clear()
                todo = [n for n in dict.fromkeys(todo + rt.dirty_observed)
                        if n.observed_by is not None]
                rt.dirty_observed = []
                todo.sort(key=_ts_key)
                continue
            # an incr.Reject withdraws the candidate it blames (its dependents become
            # stale through the usual propagation); the pass then runs again
            again = False
            for n, e in errors if errors is not None else ():
                if isinstance(e, Reject) and rejects < MAX_REJECTS and absorb_reject(rt, e):
                    rejects += 1
                    again = True
                    break
            if not again:
                break
            errors = None
            rt.failed.clear()
            todo = [n for n in dict.fromkeys(todo + rt.dirty_observed)
                    if n.observed_by is not None]
            rt.dirty_observed = []
            todo.sort(key=_ts_key)
        done = True
    except BaseException as e:
        if lending is not None:
            try:
                lend_salvage(rt, lending)  # waits for its workers: none outlives the pass;
            finally:                       # what they finished is recorded, not run again
                lend_close(rt, lending)
        if suspended:
            # interrupted with async work started for this pass: nobody will finish it
            _aio_mod().abandon(rt, suspended)
        raise
    finally:
        rt.stabilizing = False
        rt.report_log = None
        ahead_close(rt)
        for n in todo:       # (I5) one not up to date (still stale, failed, interrupted)
            if n.observed_by is not None and _needs_work(n):   # waits for the next pass
                rt.dirty_observed.append(n)
        if not done:
            # interrupted (Ctrl-C, any exception): the callbacks of what was brought up to
            # date are owed to the next pass
            owe(rt, todo)
        if token is not None:
            PyContextVar_Reset(_active, token)
        if rt.store is not None:
            try:
                flush(rt, bool(errors))
            except BaseException:
                if done:   # the pass is done but its callbacks will not run now
                    owe(rt, todo)
                raise
    failed = None
    if errors:
        failed = {}
        for n, e in errors:
            failed.setdefault(n, e)
    # callbacks run once everything is up to date, outside the trace: every one of them,
    # even if one raises; an interrupt keeps the rest for the next pass
    cdef list due = None       # (made when an observer is due: none, the usual no-op pass)
    if rt.unnotified:
        due = rt.unnotified
        rt.unnotified = []
    for n in todo:
        if n.observed_by is None:
            continue
        e = failed.get(n) if failed is not None else None
        for o in n.observed_by:
            if e is not None:
                o.error = e
            elif n.flags & F_HAS_VALUE:
                o.error = None
                if o.seen_at != n.changed_at:
                    if due is None:
                        due = [o]
                    else:
                        due.append(o)
    cb_errors = _notify(due, rt) if due else None
    report = _report(log, rt.n_reused - reused0, _now() - t0, rt.revision)
    if rt.llm is not None and rt.llm.listeners:
        from incr import llmnodes as _llm
        _llm.pass_finished(rt, report, errors)
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


cdef inline list _add_error(list errors, Instance n, object e):
    if errors is None:
        errors = []
    errors.append((n, e))
    return errors


def _ts_key(Instance n):
    return n.ts


cdef list _notify(list due, Runtime rt):
    # Call the callbacks of every observer in ``due`` once with its instance's value. An
    # exception from a callback is collected and the rest still run; an interrupt
    # (KeyboardInterrupt, SystemExit) keeps the observers not yet served for the next pass.
    # Returns the exceptions, or None when none raised.
    cdef Observer o
    cdef Py_ssize_t i
    cdef list errors = None
    for i in range(len(due)):
        o = <Observer>due[i]
        if not o.active or not (o.node.flags & F_HAS_VALUE) or o.seen_at == o.node.changed_at:
            continue
        o.seen_at = o.node.changed_at
        if not o.callbacks:
            continue       # (an observer without on_change: nothing to call)
        value = o.node.value
        try:
            for cb in list(o.callbacks):
                try:
                    cb(value)
                except Exception as e:
                    _add_note(e, f"incr: raised in an on_change callback of {o.node.label()}")
                    if errors is None:
                        errors = []
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
