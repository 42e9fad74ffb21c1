"""Async cells: `@incr.cell async def`, awaiting cells, asyncio.gather inside a cell, single
flight, cycles across tasks, cancellation, astabilize, and sync code driving async cells.

Concurrency is proven without timing: a `_Gate(n)` only opens when n callers wait on it at
once, so a serial run times out (and fails) where a concurrent one passes."""

import asyncio
import threading

import pytest

import incr
from incr.errors import CycleError, IncrError


class _Gate:
    """Opens once `n` tasks wait on it at the same time (asyncio); fails after `timeout`."""

    def __init__(self, n, timeout=5.0):
        self.n = n
        self.waiting = 0
        self.timeout = timeout
        self.event = None

    async def wait(self):
        if self.event is None:
            self.event = asyncio.Event()
        self.waiting += 1
        if self.waiting >= self.n:
            self.event.set()
        await asyncio.wait_for(self.event.wait(), self.timeout)


def run(coro):
    return asyncio.run(coro)


def make_fanout(n, log, gate=None):
    @incr.cell
    async def fetch(i):
        log.append(("fetch", i))
        if gate is not None:
            await gate.wait()
        await asyncio.sleep(0)
        return i * 10

    @incr.cell
    async def total(k):
        log.append(("total", k))
        vals = await asyncio.gather(*[fetch(i) for i in range(k)])
        return sum(vals)

    return fetch, total


def test_sync_code_gets_the_value_of_an_async_cell_and_reuses_it():
    log = []
    fetch, total = make_fanout(4, log, _Gate(4))
    rt = incr.Runtime()
    with rt:
        assert total(4) == 60
        assert sorted(log) == [("fetch", 0), ("fetch", 1), ("fetch", 2), ("fetch", 3),
                               ("total", 4)]
        log.clear()
        assert total(4) == 60
        assert log == []            # reused: nothing ran
    rt._check()


def test_gather_inside_an_async_cell_runs_independent_instances_concurrently():
    log = []
    gate = _Gate(6)                 # all six fetches must wait at once
    fetch, total = make_fanout(6, log, gate)

    async def main():
        rt = incr.Runtime()
        with rt:
            v = await total(6)
            rt._check()
            return v

    assert run(main()) == 150
    assert len([e for e in log if e[0] == "fetch"]) == 6


def test_dependencies_are_recorded_per_task_and_only_the_reader_of_a_change_reruns():
    log = []

    async def main():
        rt = incr.Runtime()
        a = rt.input("a", 1)
        b = rt.input("b", 2)
        gate = _Gate(2)

        @incr.cell
        async def read(which):
            inp = a if which == "a" else b
            first = inp.get()
            await gate.wait()           # both tasks are suspended here, interleaved
            log.append(which)
            return first + inp.get()

        @incr.cell
        async def both():
            x, y = await asyncio.gather(read("a"), read("b"))
            return (x, y)

        with rt:
            assert await both() == (2, 4)
            assert sorted(log) == ["a", "b"]
            log.clear()
            gate.n = 1                  # from now on one at a time is enough
            a.set(10)
            assert await both() == (20, 4)
            assert log == ["a"]         # read("b") never read `a`: not re-run
            rt._check()

    run(main())


def test_single_flight_two_tasks_share_one_run():
    runs = []

    async def main():
        rt = incr.Runtime()
        started = asyncio.Event()
        release = asyncio.Event()

        @incr.cell
        async def slow(x):
            runs.append(x)
            started.set()
            await release.wait()
            return x + 1

        with rt:
            t1 = asyncio.ensure_future(slow(1))
            await started.wait()
            t2 = asyncio.ensure_future(slow(1))     # the same stale instance, in flight
            await asyncio.sleep(0.01)
            release.set()
            assert await asyncio.wait_for(asyncio.gather(t1, t2), 5) == [2, 2]
            assert runs == [1]
            rt._check()

    run(main())


def test_a_cycle_across_tasks_is_a_cycle_error_not_a_deadlock():
    async def main():
        rt = incr.Runtime()
        gate = _Gate(2)

        @incr.cell
        async def a():
            await gate.wait()          # a and b both in flight before either demands the other
            return await b() + 1

        @incr.cell
        async def b():
            await gate.wait()
            return await a() + 1

        with rt:
            r = await asyncio.wait_for(asyncio.gather(a(), b(), return_exceptions=True), 5)
            assert all(isinstance(x, CycleError) for x in r), r
            assert any("a()" in str(x) and "b()" in str(x) for x in r)
            rt._check()

    run(main())


def test_an_async_cell_that_awaits_itself_is_a_cycle_error():
    @incr.cell
    async def loop_(n):
        return await loop_(n)

    async def main():
        with incr.Runtime() as rt:
            with pytest.raises(CycleError):
                await asyncio.wait_for(loop_(1), 5)
            rt._check()

    run(main())


def test_an_exception_reaches_the_awaiting_caller_and_nothing_is_kept():
    calls = []

    async def main():
        rt = incr.Runtime()
        fail = rt.input("fail", True)

        @incr.cell
        async def f():
            calls.append(1)
            await asyncio.sleep(0)
            if fail.get():
                raise ValueError("boom")
            return "ok"

        @incr.cell
        async def g():
            return (await f()) + "!"

        with rt:
            with pytest.raises(ValueError, match="boom"):
                await g()
            rt._check()
            fail.set(False)
            assert await g() == "ok!"
            assert len(calls) == 2
            rt._check()

    run(main())


def test_cancelling_the_awaiting_task_records_nothing_and_the_next_demand_reruns():
    runs = []

    async def main():
        rt = incr.Runtime()
        started = asyncio.Event()

        @incr.cell
        async def slow():
            runs.append(1)
            started.set()
            await asyncio.sleep(30)
            return "done"

        @incr.cell
        async def quick():
            runs.append(2)
            return "quick"

        with rt:
            t = asyncio.ensure_future(slow.aget())
            await started.wait()
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t
            await asyncio.sleep(0.01)
            rt._check()                     # no half-recorded run, no frame left behind
            inst = [n for n in rt._instances() if n.label_text == "slow()"][0]
            assert inst.action == "none" and not inst._has_value
            assert await quick() == "quick"  # the runtime goes on

    run(main())
    assert runs == [1, 2]


def test_astabilize_computes_observed_async_instances_concurrently_and_reports_them():
    log = []
    gate = _Gate(2)

    @incr.cell
    async def word(i):
        log.append(i)
        await gate.wait()
        return f"w{i}"

    async def main():
        rt = incr.Runtime()
        with rt:
            o1 = rt.observe(word, 1)
            o2 = rt.observe(word, 2)
            assert log == []                 # observing computes nothing
            seen = []
            o1.on_change(seen.append)
            report = await rt.astabilize()
            assert (o1.value, o2.value) == ("w1", "w2")
            assert sorted(report.recomputed) == ["word(1)", "word(2)"]
            assert seen == ["w1"]
            report = await rt.astabilize()
            assert report.recomputed == []
            rt._check()
        await rt.aclose()
        assert rt.closed

    run(main())


def test_sync_stabilize_runs_async_observed_instances_concurrently():
    gate = _Gate(3)

    @incr.cell
    async def word(i):
        await gate.wait()
        return i

    rt = incr.Runtime()
    obs = [rt.observe(word, i) for i in range(3)]
    rt.stabilize()
    assert [o.value for o in obs] == [0, 1, 2]
    rt._check()


def test_a_sync_cell_reads_an_async_cell_in_sync_code_and_from_async_code_via_aget():
    log = []
    rt = incr.Runtime()
    x = rt.input("x", 1)

    @incr.cell
    async def base():
        log.append("base")
        await asyncio.sleep(0)
        return x.get() * 2

    @incr.cell
    def plus():
        log.append("plus")
        return base() + 1

    with rt:
        assert plus() == 3
        assert log == ["plus", "base"]      # sync code: base runs on a loop of its own

    async def main():
        with rt:
            log.clear()
            x.set(5)
            assert await plus.aget() == 11
            # verification found base stale first: it ran as a task, then plus, once each
            assert log == ["base", "plus"]
            rt._check()

    run(main())

    @incr.cell
    def plus2():
        log.append("plus2")
        return base() + 2

    async def cold():
        with rt:
            log.clear()
            x.set(6)
            assert await plus2.aget() == 14
            # a first run meets base stale inside its body: it unwinds (nothing kept), base
            # runs as a task, and plus2 runs again
            assert log == ["plus2", "base", "plus2"]
            rt._check()

    run(cold())


def test_a_sync_call_inside_a_running_loop_that_needs_async_work_says_to_await():
    @incr.cell
    async def base():
        await asyncio.sleep(0.01)           # it really waits
        return 1

    @incr.cell
    def plus():
        return base() + 1

    async def main():
        with incr.Runtime() as rt:
            with pytest.raises(IncrError, match="await"):
                plus()
            rt._check()                     # the started run was closed, nothing recorded
            assert await plus.aget() == 2
            rt._check()

    run(main())


def test_cutoff_of_an_async_cell_keeps_its_readers():
    log = []

    async def main():
        rt = incr.Runtime()
        x = rt.input("x", 3)

        @incr.cell
        async def parity():
            log.append("parity")
            return x.get() % 2

        @incr.cell
        async def name():
            log.append("name")
            return "odd" if await parity() else "even"

        with rt:
            assert await name() == "odd"
            log.clear()
            x.set(5)
            assert await name() == "odd"
            assert log == ["parity"]         # equal value: name not re-run
            rt._check()

    run(main())


def test_async_cells_persist_in_the_store(tmp_path):
    runs = []

    @incr.cell(version="1")
    async def square(v):
        runs.append(v)
        await asyncio.sleep(0)
        return v * v

    async def main(path):
        rt = incr.Runtime(store=path)
        with rt:
            assert await square(7) == 49
        await rt.aclose()

    run(main(str(tmp_path / "s")))
    run(main(str(tmp_path / "s")))
    assert runs == [7]


def test_async_generator_functions_are_refused():
    with pytest.raises(TypeError, match="async generator"):
        @incr.cell
        async def gen():
            yield 1


def test_an_async_cell_whose_inputs_are_ready_finishes_without_an_event_loop():
    # a change propagated through async cells that do not wait on anything runs them in
    # their first step, on the verification's own stack: no loop, no task, no restart
    rt = incr.Runtime()
    x = rt.input("x", 1)
    runs = []

    @incr.cell
    async def c(i):
        runs.append(i)
        return x.get() if i == 0 else await c(i - 1) + 1

    with rt:
        assert c(50) == 51
        runs.clear()
        x.set(10)
        import incr._aio as aio
        calls = []
        real = aio.drive
        aio.drive = lambda coro: calls.append(1) or real(coro)
        try:
            assert c(50) == 60
        finally:
            aio.drive = real
        assert calls == [] and sorted(runs) == list(range(51))
    rt._check()


def test_other_threads_get_their_own_loop_and_the_one_thread_rule_holds():
    @incr.cell
    async def one(i):
        await asyncio.sleep(0)
        return i

    out = {}

    def work(i):
        rt = incr.Runtime()
        with rt:
            out[i] = one(i)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert out == {0: 0, 1: 1, 2: 2}


def test_a_sync_generator_run_ahead_in_astabilize_leaves_the_loop_running():
    """Two observed sync LLM nodes, whose generators (in worker threads) wait until another
    task on the same loop has run. Proven with an event, not a timing: the generators give
    up (raise) after 3 s if the loop never ran the other task. (Issue 11: the round used to
    wait for its worker threads on the loop's thread; it is now detached from the pass and
    awaited by astabilize: ahead_detach, incr.remote.Ahead.detach.)"""
    rt = incr.Runtime(max_workers=4)
    ticked = threading.Event()

    @incr.llm(version="1")
    def g(k, *, previous=None, feedback=()):
        if not ticked.wait(3):
            raise RuntimeError("the event loop was blocked while the generator ran")
        return k

    obs = [rt.observe(g, k) for k in range(2)]

    async def ticker():
        ticked.set()

    async def main():
        t = asyncio.get_running_loop().create_task(ticker())
        try:
            await rt.astabilize()
        finally:
            await t

    asyncio.run(main())
    assert [o.value for o in obs] == [0, 1]
    rt._check()


@pytest.mark.parametrize("how", ["aget", "reader"])
def test_a_call_a_detached_round_has_in_flight_is_not_made_again_for_another_task(how):
    """Single flight across a detached run-ahead round: inside ``await rt.astabilize()`` the
    round has g(0)'s generator call in flight in a worker thread (the loop running); another
    task demands g(0) meanwhile -- directly (``g.aget(0)``) or through a sync cell that reads
    it. It waits for the round's claim on g(0) and takes the call's outcome: the generator
    ran once per instance. (The attempt that awaited the round without registering it made
    the call a second time for the other task.) No timing: the first call of g(0) waits for
    an event that the other task sets only once its demand is under way; a second call
    returns at once, and is counted."""
    rt = incr.Runtime(max_workers=4)
    started = threading.Event()
    release = threading.Event()
    calls = {0: 0, 1: 0}
    lock = threading.Lock()

    @incr.llm(version="1")
    def g(k, *, previous=None, feedback=()):
        with lock:
            calls[k] += 1
            first = calls[k] == 1
        if first and k == 0:
            started.set()
            if not release.wait(5):
                raise RuntimeError("the other task never ran")
        return k * 10

    @incr.cell
    def reader():
        return g(0) + 1

    obs = [rt.observe(g, k) for k in range(2)]

    async def other():
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, started.wait, 5)
        if how == "aget":
            t = loop.create_task(g.aget(0))
        else:
            t = loop.create_task(reader.aget())
        for _ in range(5):
            await asyncio.sleep(0)      # the demand runs, and waits on the claim
        assert not t.done()
        release.set()
        return await t

    async def main():
        with rt:
            t = asyncio.get_running_loop().create_task(other())
            try:
                await rt.astabilize()
            finally:
                got = await t
        return got

    got = asyncio.run(main())
    assert got == (0 if how == "aget" else 1)
    assert calls == {0: 1, 1: 1}, calls
    assert [o.value for o in obs] == [0, 10]
    rt._check()


def test_a_cancelled_astabilize_waits_for_its_detached_rounds_calls_and_drops_them():
    """Cancelling ``astabilize()`` while its detached run-ahead round has a sync generator
    call running in a worker thread: the cancellation waits for that call (a thread cannot
    be stopped; no call outlives the cancellation) and drops its outcome (cancellation
    records nothing); the claim ends with it. A call that finished before the cancellation
    was kept: the next astabilize takes it (g(1) called once) and calls g(0) again."""
    rt = incr.Runtime(max_workers=4)
    started = threading.Event()
    release = threading.Event()
    calls = {0: 0, 1: 0}
    ended = {0: 0, 1: 0}

    @incr.llm(version="1")
    def g(k, *, previous=None, feedback=()):
        calls[k] += 1
        if k == 0 and calls[0] == 1:
            started.set()
            if not release.wait(5):
                raise RuntimeError("never released")
        ended[k] += 1
        return k * 10

    obs = [rt.observe(g, k) for k in range(2)]

    async def main():
        loop = asyncio.get_running_loop()
        with rt:
            t = loop.create_task(rt.astabilize())
            assert await loop.run_in_executor(None, started.wait, 5)
            while ended[1] == 0:
                await asyncio.sleep(0.001)
            t.cancel()
            for _ in range(10):
                await asyncio.sleep(0)
            assert not t.done()        # it waits for g(0)'s call, in its thread
            release.set()
            with pytest.raises(asyncio.CancelledError):
                await t
            assert ended == {0: 1, 1: 1}
            rt._check()
            await rt.astabilize()

    asyncio.run(main())
    assert calls == {0: 2, 1: 1}
    assert [o.value for o in obs] == [0, 10]
    rt._check()


def test_a_top_level_incr_gather_runs_async_generators_concurrently():
    """``incr.gather(...)`` from sync code (no cell, no loop running) of async LLM nodes made
    their calls one after the other (each on incr's loop, to completion); it now makes them
    concurrently, as tasks of one loop. Proven with a gate that only opens when all N calls
    wait on it at once (a serial run fails at the gate's timeout). Async cells and sync cells
    among the thunks get their values too, in order."""
    n = 3
    rt = incr.Runtime(max_workers=4)
    x = rt.input("x", 10)
    gate = _Gate(n)
    calls = []

    @incr.llm(version="1")
    async def a(k, *, previous=None, feedback=()):
        calls.append(k)
        await gate.wait()
        return k

    @incr.cell
    async def c():
        return x.get() + 1

    @incr.cell
    def s():
        return x.get() + 2

    with rt:
        got = incr.gather(*[(lambda k=k: a(k)) for k in range(n)], lambda: c(), lambda: s())
        assert got == [0, 1, 2, 11, 12]
        assert sorted(calls) == [0, 1, 2]
        assert incr.gather(lambda: a(1), lambda: c()) == [1, 11]   # up to date: no call
        assert sorted(calls) == [0, 1, 2]
    rt._check()
