"""stabilize() runs the generators of independent stale LLM instances concurrently (up to
max_workers), while the trace is changed by one thread only. A barrier that needs two
generator calls at once proves the overlap without measuring time."""

from __future__ import annotations

import threading

import pytest

import incr


def fleet(rt, parties, log):
    topic = rt.input("topic", "t0")
    barrier = threading.Barrier(parties, timeout=10)

    @incr.llm(version="1")
    def summary(i, *, previous=None, feedback=()):
        t = topic.get()                       # read in a worker thread: replayed as a dependency
        log.append((i, threading.current_thread().name))
        barrier.wait()                        # passes only if `parties` calls run at once
        return f"{t}-{i}"

    return topic, summary, barrier


def test_independent_generators_run_concurrently_in_stabilize():
    rt = incr.Runtime(max_workers=2)
    log = []
    topic, summary, barrier = fleet(rt, 1, log)  # the first computation is serial
    with rt:
        obs = [rt.observe(summary, i) for i in range(2)]
        log.clear()
        barrier._parties = 2                  # from now on, two calls must overlap
        barrier.reset()
        topic.set("t1")
        report = rt.stabilize()
    assert [o.value for o in obs] == ["t1-0", "t1-1"]
    assert sorted(i for i, _ in log) == [0, 1]
    assert all(name.startswith("incr-generate") for _, name in log)
    assert sorted(report.recomputed) == ["summary(0)", "summary(1)"]
    assert rt.stats()["generations"] == 4
    rt._check()
    # the reads made in worker threads are dependencies: another change regenerates again
    with rt:
        barrier.reset()
        topic.set("t2")
        rt.stabilize()
        assert [o.value for o in obs] == ["t2-0", "t2-1"]
    rt._check()


def test_max_workers_1_stays_serial():
    rt = incr.Runtime(max_workers=1)
    log = []
    topic, summary, _barrier = fleet(rt, 1, log)
    with rt:
        obs = [rt.observe(summary, i) for i in range(3)]
        topic.set("t1")
        rt.stabilize()
    assert [o.value for o in obs] == ["t1-0", "t1-1", "t1-2"]
    assert {name for _, name in log} == {threading.current_thread().name}


def test_a_chain_of_nodes_is_generated_in_order_with_the_same_results():
    def build(rt):
        req = rt.input("req", "r0")
        calls = []

        @incr.llm(version="a")
        def a(k, *, previous=None, feedback=()):
            calls.append("a")
            return f"A({req.get()})"

        @incr.validator(version="1")
        def mentions(candidate, k):
            return incr.ACK("m") if a(k) in candidate else incr.NACK("m", counterexample=a(k))

        @incr.llm(version="b", validators=[mentions])
        def b(k, *, previous=None, feedback=()):
            calls.append("b")
            return f"B[{a(k)}]"             # reads another node inside the generator

        @incr.cell
        def c(k):
            return b(k) + "!"

        return req, c, calls

    results = {}
    for workers in (1, 4):
        rt = incr.Runtime(max_workers=workers)
        req, c, calls = build(rt)
        with rt:
            obs = rt.observe(c, 0)
            req.set("r1")
            rt.stabilize()
            results[workers] = (obs.value, list(calls))
        rt._check()
    assert results[1] == results[4]
    value, calls = results[4]
    assert value == "B[A(r1)]!" and sorted(calls) == ["a", "a", "b", "b"]


def test_a_generator_that_reads_a_stale_cell_runs_in_the_serial_pass():
    rt = incr.Runtime(max_workers=4)
    x = rt.input("x", 1)
    threads = []

    @incr.cell
    def doubled():
        return x.get() * 2

    @incr.llm(version="1")
    def node(i, *, previous=None, feedback=()):
        threads.append(threading.current_thread().name)
        return doubled() + i

    with rt:
        obs = [rt.observe(node, i) for i in range(2)]
        threads.clear()
        x.set(5)
        rt.stabilize()
        assert [o.value for o in obs] == [10, 11]
    rt._check()


def test_generator_errors_surface_from_stabilize_as_in_a_serial_run():
    rt = incr.Runtime(max_workers=2)
    x = rt.input("x", 0)

    @incr.llm(version="1")
    def node(i, *, previous=None, feedback=()):
        if x.get() and i == 1:
            raise KeyError("broken prompt")
        return i + x.get()

    with rt:
        obs = [rt.observe(node, i) for i in range(2)]
        x.set(1)
        with pytest.raises(KeyError):
            rt.stabilize()
        assert obs[0].value == 1
    rt._check()


def test_validators_of_independent_nodes_run_concurrently():
    rt = incr.Runtime(max_workers=2)
    topic = rt.input("topic", "t0")
    barrier = threading.Barrier(1, timeout=10)
    seen = []

    @incr.validator(version="1")
    def mentions(candidate, i):
        t = topic.get()                       # read in a worker thread: replayed, recorded
        seen.append(threading.current_thread().name)
        barrier.wait()                        # passes only if both validations overlap
        return incr.ACK("topic") if t in candidate else incr.NACK("topic", counterexample=t)

    @incr.llm(version="1", validators=[mentions])
    def summary(i, *, previous=None, feedback=()):
        return f"{topic.get()}-{i}"

    with rt:
        obs = [rt.observe(summary, i) for i in range(2)]
        barrier._parties = 2
        barrier.reset()
        seen.clear()
        topic.set("t1")
        rt.stabilize()
        assert [o.value for o in obs] == ["t1-0", "t1-1"]
    assert len(seen) >= 2 and all(n.startswith("incr-generate") for n in seen[-2:])
    st = rt.state(summary, 0)
    assert st.status == "stable" and "input 'topic'" in st.dependency_revisions
    rt._check()


def test_a_branch_no_longer_taken_spends_no_model_call_in_stabilize():
    rt = incr.Runtime(max_workers=4)
    flag = rt.input("flag", True)
    topic = rt.input("topic", "t0")
    calls = []

    @incr.llm(version="1")
    def left(k, *, previous=None, feedback=()):
        calls.append("left")
        return f"L{topic.get()}"

    @incr.llm(version="1")
    def right(k, *, previous=None, feedback=()):
        calls.append("right")
        return f"R{topic.get()}"

    @incr.cell
    def pick(k):
        return left(k) if flag.get() else right(k)

    with rt:
        obs = rt.observe(pick, 0)
        calls.clear()
        with rt.batch():
            flag.set(False)                   # pick now takes the right branch ...
            topic.set("t1")                   # ... and left is stale, but no longer read
        rt.stabilize()
        assert obs.value == "Rt1"
    assert calls == ["right"]
    rt._check()
