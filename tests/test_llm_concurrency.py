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
    topic, summary, barrier = fleet(rt, 2, log)  # two calls must overlap, the first too
    with rt:
        obs = [rt.observe(summary, i) for i in range(2)]
        assert log == []                      # observing computes nothing
        rt.stabilize()                        # the first run: concurrent
        assert sorted(i for i, _ in log) == [0, 1]
        assert all(name.startswith("incr-generate") for _, name in log)
        log.clear()
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
            rt.stabilize()
            calls.clear()
            req.set("r1")
            rt.stabilize()
            results[workers] = (obs.value, list(calls))
        rt._check()
    assert results[1] == results[4]
    value, calls = results[4]
    assert value == "B[A(r1)]!" and sorted(calls) == ["a", "b"]


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


def _reader_of_a_reader(rt):
    """C: an LLM node whose validator reads x; D: an LLM node whose generator and validator
    read C; top reads D, then C. Returns the input, the nodes, the cell and the model calls."""
    x = rt.input("x", 0)
    calls = []

    @incr.validator(version="1")
    def follows_x(candidate, k):
        v = x.get()
        return incr.ACK("x") if f"x{v}" in candidate else incr.NACK("x", counterexample=v)

    @incr.llm(validators=[follows_x], version="c")
    def C(k, *, previous=None, feedback=()):
        calls.append("C")
        return f"c{len(feedback)}@x{x.get()}"     # a NACK makes it write another one

    @incr.validator(version="1")
    def quotes_c(candidate, k):
        c = C(k)
        return incr.ACK("c") if f"[{c}]" in candidate else incr.NACK("c", counterexample=c)

    @incr.llm(validators=[quotes_c], version="d")
    def D(k, *, previous=None, feedback=()):
        calls.append("D")
        return f"D[{C(k)}]"

    @incr.cell
    def top(k):
        return D(k) + " / " + C(k)

    return x, C, D, top, calls


@pytest.mark.parametrize("change", ["nack", "input"])
def test_an_llm_node_reading_a_withdrawn_llm_node_is_revalidated_in_stabilize(change):
    """D's generator and validator read C. When C regenerates (a NACK on it, or a change of
    the input its validator reads), stabilize() with concurrent calls must re-validate D and
    regenerate it, exactly as the serial pass does and as a fresh runtime computes."""
    results = {}
    for workers in (None, 1):
        rt = incr.Runtime(max_workers=workers)
        x, C, D, top, calls = _reader_of_a_reader(rt)
        with rt:
            obs = rt.observe(top, 0)
            assert obs.value == "D[c0@x0] / c0@x0"
            calls.clear()
            if change == "nack":
                rt.nack(C, 0, revision=1, case="bad", counterexample="cex")
            else:
                x.set(1)
            rt.stabilize()
            rt._check()
            seen = (obs.value, rt.state(C, 0).status, rt.state(D, 0).status,
                    rt.state(D, 0).candidate, sorted(calls))
            # and on a later demand, nothing runs and the value is the same
            calls.clear()
            assert top(0) == obs.value and D(0) == rt.state(D, 0).candidate
            assert calls == []
        rt._check()
        results[workers] = seen
    fresh = incr.Runtime(max_workers=1)
    x, C, D, top, _calls = _reader_of_a_reader(fresh)
    with fresh:
        x.set(1 if change == "input" else 0)
        from_scratch = top(0)
    want_c = "c1@x1" if change == "input" else "c1@x0"
    assert results[1] == (f"D[{want_c}] / {want_c}", "stable", "stable", f"D[{want_c}]",
                          ["C", "D"])
    assert results[None] == results[1]
    # from scratch, D quotes the C it reads (C's text differs: no NACK in its history)
    assert from_scratch == ("D[c0@x1] / c0@x1" if change == "input" else "D[c0@x0] / c0@x0")


def test_a_change_seen_before_a_dependency_that_waits_is_not_forgotten():
    """D's generator reads y, then C. y and the input C's validator reads change together: D
    sees y changed, then waits for C, whose re-validation is set aside; C keeps its candidate
    (nothing a reader could see changed). D must still re-validate in the new context (y
    moved), as in the serial pass."""
    results = {}
    for workers in (None, 1):
        rt = incr.Runtime(max_workers=workers)
        x = rt.input("x", 0)
        y = rt.input("y", 0)
        calls = []

        @incr.validator(version="1")
        def looks_at_x(candidate, k):
            x.get()
            return incr.ACK("fine")

        @incr.llm(validators=[looks_at_x], version="c")
        def C(k, *, previous=None, feedback=()):
            calls.append("C")
            return "c"

        @incr.validator(version="1")
        def follows_y(candidate, k):
            v = y.get()
            return incr.ACK("y") if candidate.startswith(f"y{v}") else incr.NACK("y", counterexample=v)

        @incr.llm(validators=[follows_y], version="d")
        def D(k, *, previous=None, feedback=()):
            calls.append("D")
            return f"y{y.get()}:{C(k)}"

        with rt:
            obs = rt.observe(D, 0)
            rt.stabilize()
            calls.clear()
            with rt.batch():
                x.set(1)
                y.set(1)
            rt.stabilize()
            results[workers] = (obs.value, rt.state(C, 0).status, rt.state(D, 0).status,
                                calls)
        rt._check()
    assert results[1] == ("y1:c", "stable", "stable", ["D"])
    assert results[None] == results[1]


def test_check_reports_a_clean_llm_node_whose_evidence_moved_on():
    """Invariant I7 can fail: a clean LLM node whose verdicts were made under a dependency
    tick that is no longer current (the state the bug above left D in), or whose state is not
    stable, is reported by rt._check()."""
    rt = incr.Runtime(max_workers=1)
    _x, C, D, top, _calls = _reader_of_a_reader(rt)
    with rt:
        top(0)
    rt._check()
    st = rt.llm.nodes[rt._instance(D, (0,), {})]
    saved = dict(st.made_under)
    assert any(k[3] == st.revision for k in saved)
    st.made_under = {k: tuple((d, at - 1) for d, at in under) for k, under in saved.items()}
    with pytest.raises(AssertionError, match=r"I7: D\(0\) is clean, but the verdict .*quotes_c "
                                             r"/ 'c' on revision 1 was made under C\(0\)"):
        rt._check()
    st.made_under = saved
    rt._check()
    st.status = "invalid"
    with pytest.raises(AssertionError, match=r"I7: D\(0\) is clean but its status is 'invalid'"):
        rt._check()


# -- a top-level demand: the stale LLM dependencies of a reader that gathered them ------------


def test_a_top_level_demand_above_a_gather_makes_the_warm_calls_at_once():
    """The reader that gathered is not the instance demanded: the walk of top() reaches
    all3's gathered dependencies and the three regenerations are made in one round."""
    rt = incr.Runtime(max_workers=4)
    x = rt.input("x", 1)
    barrier = threading.Barrier(3, timeout=5)     # a guard against a hang, not a timing
    runs = []

    @incr.llm(version="1")
    def g(i, *, previous=None, feedback=()):
        if x.get() == 2:
            barrier.wait()                         # the warm calls: needs all three at once
        return x.get() * 100 + i

    @incr.cell
    def c(i):
        return g(i) + 1

    @incr.cell
    def all3():
        runs.append("all3")
        return incr.gather(*[(lambda i=i: c(i)) for i in range(3)])

    @incr.cell
    def top():
        return sum(all3())

    with rt:
        assert top() == 306
    x.set(2)
    with rt:
        assert top() == 606
    assert runs == ["all3", "all3"]               # the reader ran once per change
    rt._check()


def test_a_demands_run_ahead_makes_no_call_a_waiting_thunk_may_no_longer_make():
    """Thunk 0 reads a(0), then h(0) only if a(0) says so; thunk 1 reads a(1). After a change
    a(0) and a(1) are regenerated at once (Barrier(2)), and h(0) -- stale, but after a(0) in
    the same thunk -- gets no call: the new a(0) takes that branch away."""
    rt = incr.Runtime(max_workers=4)
    x = rt.input("x", "go")
    barrier = threading.Barrier(2, timeout=5)
    calls = []

    @incr.llm(version="1")
    def a(i, *, previous=None, feedback=()):
        calls.append(f"a{i}")
        if x.get() == "stop":
            barrier.wait()                          # the warm calls: both at once
        return f"{x.get()}{i}"

    @incr.llm(version="1")
    def h(i, *, previous=None, feedback=()):
        calls.append(f"h{i}")
        return f"h{x.get()}"

    @incr.cell
    def both():
        return incr.gather(lambda: h(0) if a(0).startswith("go") else "no", lambda: a(1))

    with rt:
        assert both() == ["hgo", "go1"]
    calls.clear()
    x.set("stop")
    with rt:
        assert both() == ["no", "stop1"]
    assert sorted(calls) == ["a0", "a1"]
    rt._check()


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_demands_run_ahead_makes_no_call_for_a_read_outside_the_gather(where):
    """A reader reads an LLM node q outside its gather -- before it ("before": the gather
    happens only if q says so) or after it ("after": q is read only if the gathered values
    say so). After a change that takes q's branch away, q gets no call."""
    rt = incr.Runtime(max_workers=4)
    x = rt.input("x", "go")
    calls = []

    @incr.llm(version="1")
    def p(i, *, previous=None, feedback=()):
        calls.append(f"p{i}")
        return f"{x.get()}{i}"

    @incr.llm(version="1")
    def q(k, *, previous=None, feedback=()):
        calls.append("q")
        return f"q{x.get()}"

    @incr.cell
    def reader():
        if where == "before":
            if q(0) != "qgo":
                return "none"
            return incr.gather(lambda: p(1), lambda: p(2))
        vals = incr.gather(lambda: p(1), lambda: p(2))
        return [q(0)] + vals if vals[0] == "go1" else vals

    with rt:
        reader()
    calls.clear()
    x.set("stop")
    with rt:
        got = reader()
    if where == "before":
        assert got == "none" and calls == ["q"]
    else:
        assert got == ["stop1", "stop2"] and sorted(calls) == ["p1", "p2"]
    rt._check()
