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
#     pass none is set (I6); the one exception to the first: a detached round in flight
#     (below) keeps its Ahead as rt.prefetch, collecting nothing, until its last claim ends;
#   - inside a running loop (astabilize) a round is detached, not waited for on the loop's
#     thread (ahead_detach, incr.remote.Ahead.detach): its calls start in worker threads and
#     the pass unwinds (_Suspend) with one claim per instance (RoundCall), registered in
#     rt.inflight under the instance by incr._aio.do_works; a claimed instance is marked
#     F_RUNNING, so a demand from another task, or a reader's walk, waits for the claim (the
#     call is made once: single flight) and a wait chain that reaches the waiter is a
#     CycleError (incr._aio._check_cycle); astabilize awaits the claims with the loop
#     running and passes again, taking their outcomes;
#   - an instance marked F_AHEAD keeps its value, dependencies and stamps; nothing hands its
#     old value out (ensure raises _Deferred), and whatever reads it is marked and waits;
#   - an instance is listed in rt.ahead_marked when it is marked F_AHEAD (not later: a walk
#     unwound by an exception in between would leave a mark no round clears);
#   - a call set aside keeps the labels of the CycleError a read of each instance then on
#     the stack would raise (_stack_cycles); running ahead, it meets that error at such a
#     read, as the serial call would, and the run taking its outcome keeps it only if the
#     read would raise the same error there (_stack_cycles_hold): a call that closes a cycle
#     is made once, not handed over again round after round;
#   - a round runs everything handed over at once; after 32 rounds, or when nothing could run,
#     the Ahead is stopped and the rest of the pass is serial; a second round in a row with
#     nothing to run (no progress) raises an internal IncrError instead of looping.
# The threads, the executor and the replay of logged reads are incr.remote's.


cdef inline bint ahead_possible(Runtime rt):
    # whether anything could run ahead: an LLM node exists (and worker threads are allowed),
    # or an executor is set
    return (_run_ahead and rt.max_workers != 1) or rt.executor is not None


cdef inline void ahead_clear(Runtime rt):
    # unmark every instance marked F_AHEAD (between rounds, and at the end)
    cdef Instance m
    if rt.ahead_marked:     # (none marked, the usual pass: no new list)
        for m in rt.ahead_marked:
            m.flags &= ~F_AHEAD
        rt.ahead_marked = []
    rt.ahead_blocked = None


cdef void ahead_start(Runtime rt) except *:
    # a stabilize pass begins: it runs work ahead if anything could. While an earlier pass's
    # detached round is in flight (its Ahead is rt.prefetch: its workers read through it), a
    # pass inside a running loop waits for that round (its claims), and any other runs
    # beside it, serially, on that Ahead (which sets nothing aside any more)
    pf = rt.prefetch
    if pf is not None and pf.detached:
        if rt.catching and _loop_running():
            raise _Suspend(list(pf.detached))
        return
    if ahead_possible(rt):
        from incr import remote as _remote
        rt.prefetch = _remote.Ahead(rt)
        rt.prefetch.carry()      # what the last detached round left: wanted nodes, or serial
    if rt.ahead_marked:
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
    # runs again and takes the results). After 32 rounds, or a round with nothing to run,
    # the Ahead is stopped and the rest is serial; a serial round sets nothing aside, so a
    # second round in a row with nothing to run would be the same round again, for good
    # (a mark no round clears: seed 61 of tests/test_async_properties.py): an internal
    # error naming what waits, never a loop without end
    pf = rt.prefetch
    if pf is None:
        raise IncrError("incr: internal error: work waits to run ahead with no run-ahead "
                        "open (please report it)")
    waiting = [(<Instance>m).label() for m in rt.ahead_marked] if pf.idle else None
    ahead_clear(rt)
    if pf.run():
        pf.idle = 0
        if rounds > 32:
            pf.stop()           # the next round is serial
        elif pf.wanted:
            ahead_wanted(rt)
        return
    if waiting is not None:
        raise IncrError(f"incr: internal error: a serial round still waits for run-ahead "
                        f"work that nothing runs ({', '.join(waiting[:5]) or 'no instance listed'}"
                        f"); please report it")
    pf.idle = 1
    pf.stop()                   # nothing to run ahead: the next round is serial


cdef void ahead_wanted(Runtime rt) except *:
    # calls running ahead stopped at a read of a node that was not up to date (a generator of
    # a first pass reading its upstream LLM node): the driver brings those nodes up to date
    # now, their own calls running ahead in rounds of their own, so that in the next round
    # the stopped calls run ahead again -- at once -- instead of one after the other in the
    # serial pass. Each wanted node is one the stopped call reads (it read it): no call is
    # made that the serial pass would not make. When one cannot be brought up to date here
    # (async, on the stack, failed), the Ahead stops and the stopped calls run serially.
    cdef Instance n
    cdef int k
    cdef bint pending
    cdef set again = set()
    wanted = rt.prefetch.wanted
    rt.prefetch.wanted = []
    for k in range(32):
        pending = False
        for n in wanted:
            if not _needs_work(n):
                continue
            if n.cell.is_async or n.cell.awaited or n.flags & (F_RUNNING | F_VERIFYING) or (
                    not (n.flags & F_HAS_VALUE) and n in rt.failed):
                rt.prefetch.stop()
                return
            try:
                ensure(rt, n)
            except _Suspend:
                raise
            except _Deferred:
                pending = True         # its own call runs ahead: the round below
            except Exception:
                rt.prefetch.stop()     # it failed (rt.failed): the serial pass meets that
                return
        ahead_clear(rt)
        if not pending or not rt.prefetch.run():
            break
        # a call of that round stopped again at a node it waits for, whose own bring-up
        # waits for the call (a cycle a stack snapshot did not show: _stack_cycles): a
        # second time in a row, the Ahead stops -- the serial pass meets it, at once
        for n in rt.prefetch.wanted:
            if n in wanted:
                if n in again:
                    rt.prefetch.stop()
                    return
                again.add(n)
    for n in wanted:
        if _needs_work(n):
            rt.prefetch.stop()
            return


cdef void ahead_close(Runtime rt):
    # the pass or gather ends (normally or not); a detached round in flight keeps its Ahead
    # (its workers read through rt.prefetch) until its last claim ends (RoundCall.drop)
    if rt.prefetch is not None and rt.prefetch.detached:
        pass
    else:
        rt.prefetch = None
    ahead_clear(rt)


cdef object ahead_detach(Runtime rt, int rounds):
    # stabilize_pass, a round due inside a running loop (await rt.astabilize()): the calls
    # set aside start in worker threads now and the pass unwinds with their claims
    # (_Suspend), which astabilize awaits with the loop running, then passes again -- the
    # next pass takes their outcomes as after a round. None: the round is run here (no
    # loop, an executor, a demand's or gather's rounds, calls stopped at reads to bring up
    # to date first, more than 32 rounds)
    pf = rt.prefetch
    if rounds > 32 or not rt.catching or rt.frames or rt.executor is not None \
            or rt.demand_ahead or rt.gathering or not _loop_running() or pf is None \
            or not pf.collecting or not pf.pending or pf.tasks or pf.wanted or pf.detached:
        return None
    return pf.detach()


def _round_claim(Runtime rt, Instance n, bint on):
    """incr.remote.RoundCall: n's calls are in flight in a detached round (on), or no longer
    (off). Claimed, n is marked running, as an async run in flight is (its key in
    rt.inflight): a demand from another task waits for the claim (elsewhere()), a reader's
    walk too, so the call is made once."""
    if on:
        n.flags |= F_RUNNING
    else:
        n.flags &= ~F_RUNNING


cdef list stack_cycle(Runtime rt, Instance n):
    # the labels of the CycleError a read of n -- on the stack (F_RUNNING | F_VERIFYING) --
    # raises now from the innermost frame: demand_cold's, the same words
    cdef Py_ssize_t i, start = 0
    labels = [(<Frame>f).node.label() for f in rt.frames]
    for i in range(len(rt.frames)):
        if (<Frame>rt.frames[i]).node is n:
            start = i
            break
    return (cycle_labels(rt, n, None, None)
            or (labels[start:] + [n.label()] if n.flags & F_RUNNING
                else [n.label()] + labels[start:] + [n.label()]))


def _stack_cycles(Runtime rt, Instance m):
    """incr.remote.Ahead.add, in m's run (the innermost frame), a call set aside: for each
    instance on the driver's stack now that the call could read -- m, what reads m (its
    dependents, through those on the stack) and the frames' instances -- the labels of the
    CycleError that read raises in a serial run. A call running ahead that reads one of them
    raises that CycleError in its worker thread (the serial call would, at that read), and
    the run that takes its outcome checks that the read still would (_stack_cycles_hold).
    None when there is nothing to give (no frame, async work in flight: a wait, not a
    cycle)."""
    cdef Instance x, d
    cdef Frame f
    if not rt.frames or rt.inflight or (<Frame>rt.frames[len(rt.frames) - 1]).node is not m:
        return None
    out = {}
    todo = []
    for f in rt.frames:
        if f.node.flags & (F_RUNNING | F_VERIFYING) and f.node not in out:
            out[f.node] = None
            todo.append(f.node)
    if m not in out:
        out[m] = None
        todo.append(m)
    while todo:
        x = todo.pop()
        for d in x.dependents or ():
            if d not in out and d.flags & (F_RUNNING | F_VERIFYING):
                out[d] = None
                todo.append(d)
    for x in list(out):
        out[x] = tuple(stack_cycle(rt, x))
    return out


def _stack_cycles_hold(Runtime rt, list reads):
    """incr.llmnodes, a run taking the outcome of a call that ran ahead and raised a
    CycleError at a read of an instance on the stack (reads: (instance, labels)): whether
    each read would raise that same CycleError now."""
    cdef Instance n
    for n, labels in reads:
        if not (n.flags & (F_RUNNING | F_VERIFYING)) or rt.inflight \
                or tuple(stack_cycle(rt, n)) != labels:
            return False
    return True


cdef int ahead_ship(Runtime rt, Instance m, list stack) except -1:
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
        stack.append(d)          # (its walk_at is 0: it is on no stack)
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
        return attempt(rt, m, stack)
    if r == 1:
        rt.remote = m    # its run here takes the executor's result (attempt clears this)
    return NOMATCH


# -- lending: plain sync cells run in worker threads ----------------------------------------
# A pass with two or more observed instances ready to run, or an incr.gather of two or more
# thunks, lends all but the first to worker threads (incr.remote.Ahead.lend, at most
# max_workers - 1 in flight) and does the first itself. A worker runs the cell's function
# (or the thunk) with its reads logged, not recorded: it may read inputs (revision R: a set
# from another thread is queued until the pass ends) and instances that are up to date, and
# it may compute, nested, a first computation that nothing else runs (_lend_state, 0); any
# other read stops it ("missing"). The driver takes a worker's run where attempt() would
# run the instance (lend_take): it waits for the job, checks that every read is still
# current, and runs the instance with rt.remote set, so that run() replays the logged reads
# through the ordinary read path and records value, edges, stamps and store record exactly
# as a local run. A run that stopped, or whose reads moved on, is simply run here.
#
# Contract:
#   - rt.lent is None outside an open lending; lend_close waits for every job of its lending
#     (no worker outlives the pass or gather that started it) and drops what was not taken;
#   - a worker never changes the trace (flags, edges, stamps, values): it reads, and hands
#     back (kind, payload, log, cells);
#   - max_workers=1, a single ready instance, a chain: nothing is lent, no thread handoff.


cdef inline bint lend_ok(Cell c):
    # a worker thread may run this cell's function: sync, not an LLM node, not an effect
    return not (c.is_async or c.awaited or c.is_llm) and \
        not getattr(c, "_incr_effect", False)


cdef inline bint lend_wanted(Runtime rt):
    # plain cells run in worker threads when the runtime asks for threads (max_workers=N,
    # N >= 2, given explicitly: the default keeps plain cells in the driver thread -- under
    # the GIL, threads help only cells that wait on I/O) and no executor ships cells itself.
    # With a store, the driver looks instances up in it first (a worker would compute what
    # the store holds, and race the lookup): no lending
    return rt.max_workers is not None and rt.max_workers != 1 and rt.executor is None \
        and rt.store is None


cdef bint lend_ready(Runtime rt, Instance n):
    # n runs when the pass reaches it, and a worker could run it now: a first computation,
    # or a stale instance whose dependencies are all up to date, one of them changed
    cdef Node d
    cdef bint changed = False
    if n.flags & (F_AHEAD | F_RUNNING | F_VERIFYING | F_INVALID) or not lend_ok(n.cell):
        return False
    if not (n.flags & F_HAS_VALUE):
        return n not in rt.failed
    if not (n.flags & F_DIRTY):
        return False
    for d in n.deps:
        if _needs_work(d):
            return False
        if d.changed_at > n.verified_at:
            changed = True
    return changed


cdef object lend_pass(Runtime rt, list todo):
    # the observed instances of this round that a worker could run now: with two or more,
    # all but the first are lent (the driver does the first); None when nothing is lent
    cdef Instance n
    if len(todo) < 2 or not lend_wanted(rt):
        return None
    cdef list ready = []
    for n in todo:
        if _needs_work(n) and lend_ready(rt, n):
            ready.append(n)
    if len(ready) < 2:
        return None
    return lend_open(rt, ready[1:], False)


cdef object lend_open(Runtime rt, list jobs, bint thunks):
    # lend jobs (instances, or a gather's thunks) to worker threads; the pass's Ahead runs
    # them (one is made for the lending when the pass has none: no LLM node, no executor)
    from incr import remote as _remote
    cdef bint own = rt.prefetch is None
    if own:
        rt.prefetch = _remote.Ahead(rt)
        rt.prefetch.collecting = False     # nothing else runs ahead
    if rt.lent is None:
        rt.lent = {}
    try:
        return rt.prefetch.lend(jobs, thunks, own)
    except BaseException:
        if own:
            rt.prefetch = None
        if not rt.lent:
            rt.lent = None
        raise


cdef void lend_salvage(Runtime rt, object lending) except *:
    # the pass is interrupted: the lent runs that finished and stand are recorded now (a run
    # that completed is not run again by the next pass); the rest waits for it. Only replays
    # reads: no function runs here
    cdef Instance m
    for m in lending.finish():
        if not _needs_work(m) or m.flags & (F_RUNNING | F_VERIFYING | F_AHEAD):
            continue
        out = rt.prefetch.lent_result(m)
        if out is None or not lend_fresh(rt, <list>out[2], <dict>out[3]):
            continue
        for d, at in <list>out[2]:
            if at is None and _needs_work(<Node>d):
                break                  # it read a first computation of the worker's: not now
        else:
            rt.remote = m
            try:
                run(rt, m)
            except Exception:
                pass                   # its own exception: recorded as a failed run
            finally:
                rt.remote = None


cdef void lend_close(Runtime rt, object lending) except *:
    # the pass's round or the gather ends (normally or not): wait for the lending's jobs, drop
    # what was not taken
    try:
        lending.close()
    finally:
        if not rt.lent:
            rt.lent = None
        if lending.own:
            rt.prefetch = None


cdef bint lend_take(Runtime rt, Instance m) except -1:
    # attempt(): m was lent (or a worker computed it): wait for that run; True, with
    # rt.remote = m, when it stands -- every read it made is current -- so that run() takes it
    cdef object out = rt.prefetch.lent_result(m)
    if out is None:
        return False                   # it stopped, or was never sent: it runs here
    if not lend_fresh(rt, <list>out[2], <dict>out[3]):
        rt.prefetch.lent_done.pop(m, None)
        return False
    rt.remote = m
    return True


cdef bint lend_fresh(Runtime rt, list log, dict cells) except -1:
    # every read a worker's run made is still what it read: an up-to-date node with the same
    # change tick, or a first computation the worker made whose value this pass agrees with
    cdef Node d
    cdef tuple r
    for d, at in log:
        if at == -1:                   # it read a failure of this pass
            if d.flags & F_HAS_VALUE or d not in rt.failed:
                return False
            continue
        if at is not None:
            if _needs_work(d) or d.changed_at != at:
                return False
            continue
        r = <tuple>cells[d]
        if (d.flags & (F_HAS_VALUE | F_DIRTY)) == F_HAS_VALUE:
            if r[0] != "ok" or not _same_value(d.value, r[1]):
                return False
        elif d.flags & (F_HAS_VALUE | F_RUNNING | F_VERIFYING | F_AHEAD) or d in rt.failed:
            return False
        else:
            other = rt.prefetch.lent_done.get(d)
            if other is None or other[0] != r[0] or not (
                    other[1] is r[1] or r[0] == "ok" and _same_value(other[1], r[1])):
                return False
    return True


def _lend_state(Runtime rt, Instance n):
    """In a worker thread, for n not up to date when read: 0 it may compute n itself (a
    first computation of a plain sync cell nothing else runs, lends or failed in this pass);
    1 a plain cell the driver brings up to date (stale, running there, or lent) and 2 one
    it may not run (runs ahead, not a plain sync cell): either way the worker's run stops;
    3 n is up to date now; 4 n failed in this pass."""
    if (n.flags & (F_DIRTY | F_HAS_VALUE | F_RUNNING | F_VERIFYING)) == F_HAS_VALUE:
        return 3
    if not (n.flags & (F_HAS_VALUE | F_RUNNING | F_VERIFYING)) and n in rt.failed:
        return 4
    if n.flags & F_AHEAD or not lend_ok(n.cell):
        return 2
    if not (n.flags & (F_HAS_VALUE | F_RUNNING | F_VERIFYING)) and (
            rt.lent is None or n not in rt.lent):
        return 0
    return 1


def _lend_claim(Runtime rt, Instance n, box):
    """In a worker thread: claim n's first computation for this job (rt.lent[n] = box), if
    it is still one nothing else runs; the check and the claim make no Python call between
    them, so under the GIL the driver cannot start n in between."""
    if n.flags & (F_HAS_VALUE | F_RUNNING | F_VERIFYING | F_AHEAD) or rt.lent is None \
            or box is None or n in rt.lent or n in rt.failed or not lend_ok(n.cell):
        return False
    rt.lent[n] = box
    return True


def _lend_failure(Runtime rt, Instance n):
    return rt.failed[n]


def _lend_invoke(Instance n):
    """In a worker thread: call n's function on its own copy of the arguments."""
    if n.fresh_args:
        return n.cell.invoke(_keys.own_args(n.args))
    return n.cell.invoke(n.args)


def _lend_same(a, b):
    return _same_value(a, b)


# -- a demand's run-ahead: the stale LLM dependencies of a reader that gathered them ---------
# A top-level demand (settle) opens no run-ahead until its verification walk, with no cell
# running, is about to bring up to date a dependency that a reader read inside an incr.gather
# of its last run, and two or more thunks' dependencies need work (ahead_trigger): the walk
# then starts again with a run-ahead open, in rounds as stabilize's (demand_ahead), so the
# stale LLM dependencies of every thunk set their calls aside in one round and are made at
# once. The walk of a reader whose dependency now runs ahead goes on (ahead_wait, ahead_scan)
# only to the dependencies that other thunks of the same gather read first: the reader's new
# run reads those whatever the value that runs ahead turns out to be (the thunks are made
# before gather is called; what the reader read before the gather checked out unchanged, else
# the walk stopped there). The rest of that thunk's reads, another gather's, and whatever the
# reader read outside a gather wait for the next round: no model call for a branch the new run
# may not take. (Speculative only where a thunk's first read of a node another thunk read
# first decides what else it reads: the dependency is tagged with the thunk that read it
# first.) stabilize's walk is unchanged: it goes on past every dependency that runs ahead.
#
# Contract:
#   - rt.gathered[m] is written only while m's run gathers (gather_tag, in the driver, from
#     incr.gather) and dropped by attempt() before m runs again (put back when that run
#     records nothing: _Deferred); it never changes what is recomputed, only what may be set
#     aside together;
#   - rt.demand_ahead is 0 outside demand_ahead(); _OpenAhead never escapes it; the
#     run-ahead it opens is closed on every exit (ahead_close), rt.ahead_blocked with it.


class _OpenAhead(Exception):
    """ensure() in a top-level demand: a reader's gathered dependencies need work; the walk
    starts again with a run-ahead open (demand_ahead). Never escapes settle()."""


cdef object demand_ahead(Runtime rt, Instance n):
    # settle(): a top-level demand of n -- ensure(n); when its walk reaches the gathered
    # dependencies of a reader that need work, again with a run-ahead open, in rounds
    cdef int rounds = 0
    if rt.gathered is None or rt.prefetch is not None or rt.executor is not None \
            or not (_run_ahead and rt.max_workers != 1):
        return ensure(rt, n)
    rt.demand_ahead = 1
    try:
        try:
            return ensure(rt, n)
        except _OpenAhead:
            pass           # (ensure cleared its stack: what it brought up to date stands)
        ahead_start(rt)
        rt.demand_ahead = 2
        while True:
            try:
                return ensure(rt, n)
            except _Suspend:
                raise
            except _Deferred:
                rounds += 1
                ahead_round(rt, rounds)    # the calls set aside are made, at once
    finally:
        if rt.demand_ahead == 2:
            ahead_close(rt)
        rt.demand_ahead = 0


cdef bint ahead_trigger(Runtime rt, Instance m, Node d) except -1:
    # ensure(), a demand with no run-ahead open yet, about to push d for m: raises _OpenAhead
    # when no cell runs, d was read inside a gather of m's last run, and another thunk's
    # dependency of m needs work too
    cdef dict tags
    cdef Node e
    if rt.frames or rt.gathered is None:
        return False
    tags = rt.gathered.get(m)
    if tags is None:
        return False
    tag = tags.get(d)
    if tag is None:
        return False
    for e in m.deps:
        if e is not d and _needs_work(e):
            other = tags.get(e)
            if other is not None and other[0] == tag[0] and other[1] != tag[1]:
                raise _OpenAhead()
    return False


cdef bint ahead_wait(Runtime rt, Instance m, Node d) except -1:
    # ensure(), a demand's run-ahead: m waits for d, which runs ahead. True when the scan of
    # m's dependencies goes on -- d was read first by a thunk of a gather of m's last run; the
    # other reads of that thunk wait with it
    cdef dict tags = rt.gathered.get(m) if rt.gathered is not None else None
    tag = tags.get(d) if tags is not None else None
    if tag is None:
        return False
    if rt.ahead_blocked is None:
        rt.ahead_blocked = {}
    b = rt.ahead_blocked.get(m)
    if b is None:
        rt.ahead_blocked[m] = [tag[0], {tag[1]}]
        return True
    if b[0] != tag[0]:
        return False
    b[1].add(tag[1])
    return True


cdef int ahead_scan(Runtime rt, Instance m, Node d) except -1:
    # ensure(), a demand's run-ahead, m waiting (F_AHEAD): 0 scan d (another thunk of the same
    # gather read it first), 1 skip it (a thunk that waits read it), 2 stop the scan
    b = rt.ahead_blocked.get(m) if rt.ahead_blocked is not None else None
    if b is None:
        return 2
    cdef dict tags = rt.gathered.get(m) if rt.gathered is not None else None
    tag = tags.get(d) if tags is not None else None
    if tag is None or tag[0] != b[0]:
        return 2
    return 1 if tag[1] in b[1] else 0


cdef void gather_tag(Runtime rt, object frame, Py_ssize_t k0, object tag) except *:
    # incr.gather in the driver: the reads thunk `tag` (gather, index) added to the running
    # frame since k0 are tagged with it, for the reader's next verification
    cdef Frame f = <Frame>frame
    cdef list reads = f.reads
    cdef Py_ssize_t k
    cdef dict tags
    if len(reads) <= k0:
        return
    if rt.gathered is None:
        rt.gathered = {}
    tags = rt.gathered.get(f.node)
    if tags is None or tags.get(None) != f.id:    # (another run's: this run's replace them)
        tags = rt.gathered[f.node] = {None: f.id}
    for k in range(k0, len(reads)):
        tags.setdefault(reads[k], tag)
