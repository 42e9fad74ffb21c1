"""First runs in parallel: lazy observe, incr.gather / cell.map, LLM generator calls in
threads (sync) and tasks (async), in every way of driving them.

Concurrency is proven without timing: a barrier that only opens when N calls wait at once
fails a serial run (BrokenBarrierError / TimeoutError) where a concurrent one passes."""

import asyncio
import threading

import pytest

import incr
from incr.errors import NotAccepted

N = 5


def barrier_node(n, calls):
    barrier = threading.Barrier(n, timeout=5)

    @incr.llm
    def node(i, *, previous=None, feedback=()):
        calls.append(i)
        barrier.wait()             # needs n calls at once
        return f"answer {i}"

    return node


def test_observe_computes_nothing_and_the_next_stabilize_computes_every_observed_instance():
    calls = []
    node = barrier_node(N, calls)
    rt = incr.Runtime(max_workers=N)
    obs = [rt.observe(node, i) for i in range(N)]
    assert calls == []
    report = rt.stabilize()
    assert [o.value for o in obs] == [f"answer {i}" for i in range(N)]
    assert sorted(calls) == list(range(N))
    assert sorted(report.recomputed) == sorted(f"node({i})" for i in range(N))
    rt._check()


def test_observer_value_before_any_stabilize_stabilizes():
    calls = []
    node = barrier_node(2, calls)
    rt = incr.Runtime(max_workers=2)
    o1, o2 = rt.observe(node, 1), rt.observe(node, 2)
    seen = []
    o2.on_change(seen.append)
    assert o1.value == "answer 1"       # both computed, together (the barrier needs two)
    assert seen == ["answer 2"]         # a stabilization: callbacks got the first value
    assert o2.value == "answer 2"
    assert sorted(calls) == [1, 2]
    rt._check()


def test_gather_inside_a_sync_cell_makes_the_generator_calls_at_once():
    calls = []
    node = barrier_node(N, calls)

    @incr.cell
    def top():
        return incr.gather(*[(lambda i=i: node(i)) for i in range(N)])

    rt = incr.Runtime(max_workers=N)
    with rt:
        assert top() == [f"answer {i}" for i in range(N)]
        assert sorted(calls) == list(range(N))
        calls.clear()
        assert top() == [f"answer {i}" for i in range(N)]
        assert calls == []
    rt._check()


def test_cell_map_at_top_level_is_concurrent_and_in_order():
    calls = []
    node = barrier_node(N, calls)
    rt = incr.Runtime(max_workers=N)
    with rt:
        assert node.map(range(N)) == [f"answer {i}" for i in range(N)]
        assert incr.gather(lambda: node(0), lambda: node(4)) == ["answer 0", "answer 4"]
    assert sorted(calls) == list(range(N))
    rt._check()


def test_max_workers_1_is_serial_and_gives_the_same_answers():
    active, peak, calls = [0], [0], []
    lock = threading.Lock()

    @incr.llm
    def node(i, *, previous=None, feedback=()):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        calls.append(i)
        with lock:
            active[0] -= 1
        return i * 2

    @incr.cell
    def top():
        return node.map(range(6))

    serial = incr.Runtime(max_workers=1)
    with serial:
        assert top() == [0, 2, 4, 6, 8, 10]
    assert peak[0] == 1 and sorted(calls) == list(range(6))
    serial._check()


def test_gather_raises_the_first_exception_as_calling_in_order_would():
    @incr.cell
    def ok(i):
        return i

    @incr.cell
    def bad(i):
        raise ValueError(f"bad {i}")

    with incr.Runtime() as rt:
        with pytest.raises(ValueError, match="bad 1"):
            incr.gather(lambda: ok(0), lambda: bad(1), lambda: bad(2))
        with pytest.raises(TypeError, match="lambda"):
            incr.gather(ok(0))          # a value, not a function
        rt._check()


def test_a_change_reruns_only_the_changed_branch_of_a_gather():
    calls = []
    rt = incr.Runtime(max_workers=4)
    x = rt.input("x", 1)

    @incr.llm
    def node(i, *, previous=None, feedback=()):
        calls.append(i)
        return f"{i}:{x.get() if i == 0 else 0}"

    @incr.cell
    def top():
        return incr.gather(*[(lambda i=i: node(i)) for i in range(4)])

    obs = rt.observe(top)
    rt.stabilize()
    calls.clear()
    x.set(2)
    rt.stabilize()
    assert obs.value == ["0:2", "1:0", "2:0", "3:0"]
    assert calls == [0]
    rt._check()


# -- async LLM nodes ----------------------------------------------------------------------


class _Gate:
    def __init__(self, n):
        self.n, self.waiting, self.event = n, 0, None

    async def wait(self):
        if self.event is None:
            self.event = asyncio.Event()
        self.waiting += 1
        if self.waiting >= self.n:
            self.event.set()
        await asyncio.wait_for(self.event.wait(), 5)


def async_nodes(n):
    gate = _Gate(n)
    calls = []

    @incr.validator
    async def no_draft(c, i):
        await asyncio.sleep(0)
        if c.startswith("draft"):
            return incr.NACK("final", counterexample=c, message="still a draft")
        return incr.ACK("final")

    @incr.llm(validators=[no_draft])
    async def ask(i, *, previous=None, feedback=()):
        calls.append((i, previous))
        if previous is None:
            await gate.wait()           # the first calls of all n nodes at once
            return f"draft {i}"
        return f"final {i}"

    return ask, calls


def test_async_generators_run_concurrently_under_asyncio_gather_and_nacks_regenerate():
    ask, calls = async_nodes(N)

    @incr.cell
    async def report():
        return list(await asyncio.gather(*[ask(i) for i in range(N)]))

    async def main():
        rt = incr.Runtime()
        with rt:
            assert await report() == [f"final {i}" for i in range(N)]
            assert len(calls) == 2 * N          # one draft (NACKed) and one final each
            assert rt.state(ask, 0).status == "stable"
            rt._check()

    asyncio.run(main())


def test_async_generators_concurrent_under_astabilize_and_under_sync_stabilize():
    ask, calls = async_nodes(3)

    async def main():
        rt = incr.Runtime()
        obs = [rt.observe(ask, i) for i in range(3)]
        await rt.astabilize()
        assert [o.value for o in obs] == ["final 0", "final 1", "final 2"]
        rt._check()

    asyncio.run(main())

    ask2, calls2 = async_nodes(3)
    rt = incr.Runtime(max_workers=3)
    obs = [rt.observe(ask2, i) for i in range(3)]
    rt.stabilize()                               # sync code: generator calls in threads
    assert [o.value for o in obs] == ["final 0", "final 1", "final 2"]
    assert len(calls2) == 6
    rt._check()


def test_an_async_node_in_sync_code_and_top_level_await():
    ask, calls = async_nodes(1)
    with incr.Runtime():
        assert ask(7) == "final 7"

    ask2, _ = async_nodes(1)

    async def main():
        with incr.Runtime():
            assert await ask2(8) == "final 8"
            assert await ask2.aget(8) == "final 8"

    asyncio.run(main())


def test_an_async_node_that_never_satisfies_ends_not_accepted():
    @incr.validator
    async def never(c):
        return incr.NACK("never", counterexample=c)

    @incr.llm(validators=[never], budget=incr.Budget(max_attempts=3))
    async def ask(*, previous=None, feedback=()):
        await asyncio.sleep(0)
        return f"try {len(feedback)}-{previous}"

    async def main():
        with incr.Runtime() as rt:
            with pytest.raises(NotAccepted) as e:
                await ask()
            assert e.value.reason in ("budget", "no_progress", "oscillation")
            rt._check()

    asyncio.run(main())


# -- one pass, one revision ----------------------------------------------------------------


def test_a_set_from_another_thread_during_a_pass_forms_the_next_revision():
    rt = incr.Runtime()
    x = rt.input("x", 0)
    inside, release = threading.Event(), threading.Event()
    seen = []

    @incr.cell
    def slow():
        v = x.get()
        if v == 1:
            inside.set()
            release.wait(10)
        seen.append((v, x.get()))        # never a mix of two revisions
        return v

    obs = rt.observe(slow)
    rt.stabilize()
    x.set(1)
    t = threading.Thread(target=rt.stabilize)
    t.start()
    assert inside.wait(10)
    rev = rt.revision
    x.set(2)                             # from this thread, while the pass is in flight
    assert x.peek() == 1 and rt.revision == rev  # not seen by the pass in flight
    release.set()
    t.join()
    assert seen[-1] == (1, 1)
    assert x.get() == 2 and rt.revision == rev + 1
    rt.stabilize()
    assert obs.value == 2 and seen[-1] == (2, 2)
    rt._check()


def test_an_async_run_that_saw_an_input_change_mid_run_is_not_kept():
    runs = []

    async def main():
        rt = incr.Runtime()
        a = rt.input("a", 1)
        started, go = asyncio.Event(), asyncio.Event()

        @incr.cell
        async def both():
            first = a.get()
            started.set()
            await go.wait()
            runs.append((first, a.get()))
            return (first, a.get())

        with rt:
            task = asyncio.ensure_future(both())
            await started.wait()
            a.set(2)                     # another task changes it while both() is suspended
            go.set()
            assert await task == (2, 2)  # the mixed run was not handed out
            assert runs == [(1, 2), (2, 2)]
            rt._check()

    asyncio.run(main())


def test_max_concurrency_bounds_async_model_calls_in_flight():
    active, peak = [0], [0]

    @incr.llm
    async def ask(i, *, previous=None, feedback=()):
        active[0] += 1
        peak[0] = max(peak[0], active[0])
        await asyncio.sleep(0.01)
        active[0] -= 1
        return i

    @incr.cell
    async def all_of(n):
        return list(await asyncio.gather(*[ask(i) for i in range(n)]))

    async def main(limit):
        with incr.Runtime(max_concurrency=limit) as rt:
            assert await all_of(6) == list(range(6))
            rt._check()

    asyncio.run(main(2))
    assert peak[0] == 2
    with pytest.raises(ValueError, match="max_concurrency"):
        incr.Runtime(max_concurrency=0)

