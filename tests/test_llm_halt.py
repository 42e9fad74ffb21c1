"""rt.halt(reason) / rt.resume(): an operator's stop outside the model. Every running LLM loop
stops before its next generator call with NotAccepted(reason="halted") whose report names the
reason; nothing partial is recorded; the runtime stays usable; after rt.resume() the same
demand goes on. rt.halt only sets a flag: it works from another thread and from a signal
handler. Synchronisation is by events and barriers, never by timing."""

from __future__ import annotations

import asyncio
import signal
import threading

import pytest

import incr


def test_halt_and_resume_set_and_clear_the_reason():
    rt = incr.Runtime()
    assert rt.halted is None
    rt.halt("cost alert")
    assert rt.halted == "cost alert"
    rt.halt("second alert")                 # a second halt replaces the reason
    assert rt.halted == "second alert"
    rt.resume()
    assert rt.halted is None
    rt.resume()                             # not halted: a no-op
    assert rt.halted is None
    with pytest.raises(TypeError, match="rt.halt: reason must be a str"):
        rt.halt(None)
    with pytest.raises(ValueError, match="non-empty"):
        rt.halt("")
    with pytest.raises(TypeError, match="valid text"):
        rt.halt("bad \ud800")
    assert rt.halted is None


def test_halt_from_another_thread_stops_the_loop_before_its_next_generator_call():
    rt = incr.Runtime()
    calls = []
    validating, halted = threading.Event(), threading.Event()

    @incr.validator(version="1")
    def says_b(candidate, q):
        if not validating.is_set():
            validating.set()                # the loop is running: let the operator halt it
            assert halted.wait(10)
        if candidate == "b":
            return incr.ACK("b")
        return incr.NACK("b", counterexample={"got": candidate}, message="say b")

    @incr.llm(validators=[says_b], budget=incr.Budget(max_attempts=5), version="1")
    def gen(q, *, previous=None, feedback=()):
        calls.append((previous, tuple(v.case for v in feedback)))
        return "a" if len(calls) == 1 else "b"

    def operator():
        assert validating.wait(10)
        rt.halt("operator: spend alert")
        halted.set()

    t = threading.Thread(target=operator)
    t.start()
    with rt:
        with pytest.raises(incr.NotAccepted) as ei:
            gen("q")
    t.join(10)
    e = ei.value
    assert e.reason == "halted"
    assert "operator: spend alert" in e.report
    assert len(calls) == 1                  # the NACK would have asked for a second call
    rt._check()
    # the node keeps what it had when the halt came: revision 1 and its NACK, nothing more
    st = rt.state(gen, "q")
    assert (st.revision, st.candidate, st.status) == (1, "a", "active")
    assert [(k[2], k[3], v.kind) for k, v in st.checks.items()] == [("b", 1, "NACK")]
    # while halted, the demand raises at once without calling the generator
    with rt:
        with pytest.raises(incr.NotAccepted, match="halted"):
            gen("q")
    assert len(calls) == 1
    assert rt.state(gen, "q").revision == 1
    rt._check()
    rt.resume()
    with rt:
        assert gen("q") == "b"              # the same demand goes on where it stopped
    assert calls == [(None, ()), ("a", ("b",))]
    st = rt.state(gen, "q")
    assert (st.revision, st.status) == (2, "stable")
    assert rt.stats()["generations"] == 2
    rt._check()


def test_halt_from_a_signal_handler():
    if not hasattr(signal, "setitimer") or threading.current_thread() is not \
            threading.main_thread():
        pytest.skip("needs SIGALRM in the main thread")
    rt = incr.Runtime()
    calls = []
    rang = threading.Event()

    def on_alarm(signum, frame):
        rt.halt("SIGALRM from the operator")   # no lock, no claim on the busy runtime
        rang.set()

    @incr.validator(version="1")
    def never(candidate, q):
        return incr.NACK("never", counterexample=candidate)

    @incr.llm(validators=[never], budget=incr.Budget(max_attempts=5), version="1")
    def gen(q, *, previous=None, feedback=()):
        calls.append(previous)
        if len(calls) == 1:
            assert rang.wait(30)            # the alarm comes while the first call runs
        return f"answer {len(calls)}"

    old = signal.signal(signal.SIGALRM, on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with rt:
            with pytest.raises(incr.NotAccepted) as ei:
                gen("q")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert ei.value.reason == "halted"
    assert "SIGALRM from the operator" in ei.value.report
    assert calls == [None]                  # the call running at the alarm, no other
    assert rt.halted == "SIGALRM from the operator"
    rt._check()
    rt.resume()
    with rt:
        with pytest.raises(incr.NotAccepted) as ei:
            gen("q")
    assert ei.value.reason == "budget"      # it went on: four more calls, then the budget
    assert len(calls) == 5
    rt._check()


def test_while_halted_only_demands_that_need_a_model_call_stop():
    rt = incr.Runtime()
    x = rt.input("x", 1)
    calls = []

    @incr.validator(version="1")
    def same_sign(candidate, q):
        ok = candidate * x.get() > 0
        return incr.ACK("sign") if ok else incr.NACK("sign", counterexample=candidate)

    @incr.llm(validators=[same_sign], version="1")
    def gen(q, *, previous=None, feedback=()):
        calls.append(q)
        return x.get() * 10

    @incr.cell
    def reader(q):
        return gen(q) + 1

    with rt:
        assert reader("a") == 11
    rt.halt("maintenance")
    with rt:
        assert reader("a") == 11            # PASS: no model call needed
        with pytest.raises(incr.NotAccepted) as ei:
            reader("b")                     # a new instance needs a model call
        assert ei.value.reason == "halted" and "maintenance" in ei.value.report
        x.set(2)                            # gen("a")'s context changes: re-validated,
        assert reader("a") == 11            # still accepted, no model call
        x.set(-1)
        with pytest.raises(incr.NotAccepted, match="halted"):
            reader("a")                     # rejected in the new context: it must generate
    assert calls == ["a"]
    st = rt.state(gen, "a")
    assert (st.revision, st.candidate) == (1, 10)
    assert rt.state(gen, "b").revision == 0
    rt._check()
    rt.resume()
    x.set(3)
    with rt:
        assert reader("a") == 11            # 10 has x's sign again: re-accepted
        assert reader("b") == 31
    assert calls == ["a", "b"]
    rt._check()


def test_halted_stabilize_with_workers_calls_no_model():
    rt = incr.Runtime(max_workers=4)
    topic = rt.input("topic", "t0")
    calls = []

    @incr.llm(version="1")
    def summary(i, *, previous=None, feedback=()):     # no validators: a change regenerates
        calls.append(i)
        return f"{topic.get()}-{i}"

    @incr.validator(version="1")
    def short(candidate, i):
        topic.get()
        return incr.ACK("short") if len(candidate) < 20 else incr.NACK("short")

    @incr.llm(validators=[short], version="1")
    def title(i, *, previous=None, feedback=()):       # re-validated: accepted again
        calls.append(("title", i))
        return f"title {i}"

    with rt:
        obs = [rt.observe(summary, i) for i in range(4)]
        tobs = [rt.observe(title, i) for i in range(2)]
        rt.stabilize()
    calls.clear()
    rt.halt("nightly freeze")
    topic.set("t1")
    with pytest.raises(incr.NotAccepted) as ei:
        rt.stabilize()
    assert ei.value.reason == "halted" and "nightly freeze" in ei.value.report
    assert calls == []                                  # nobody called the model
    assert all(isinstance(o.error, incr.NotAccepted) and o.error.reason == "halted"
               for o in obs)
    assert [o.value for o in tobs] == ["title 0", "title 1"] and \
        all(o.error is None for o in tobs)
    assert [rt.state(summary, i).candidate for i in range(4)] == [f"t0-{i}" for i in range(4)]
    rt._check()
    rt.resume()
    rt.stabilize()
    assert sorted(calls) == [0, 1, 2, 3]
    assert [o.value for o in obs] == [f"t1-{i}" for i in range(4)]
    rt._check()


def test_halt_while_generators_run_in_worker_threads():
    """The halt comes while two calls run ahead in worker threads: those two finish, but
    their results are dropped (the loops stop before taking them); the calls set aside
    behind them are never made. After resume, every node generates again."""
    rt = incr.Runtime(max_workers=2)
    topic = rt.input("topic", "t0")
    calls = []
    lock = threading.Lock()
    inside = threading.Barrier(2, timeout=10)     # both workers are in a call
    after = threading.Barrier(2, timeout=10)      # ... and stay there until the halt is on
    first_round = threading.Event()

    @incr.llm(version="1")
    def summary(i, *, previous=None, feedback=()):
        t = topic.get()
        with lock:
            k = len(calls)
            calls.append((i, t))
        if first_round.is_set() and k < 2:
            inside.wait()
            if k == 0:
                rt.halt("operator in a worker's time")
            after.wait()
        return f"{t}-{i}"

    with rt:
        obs = [rt.observe(summary, i) for i in range(4)]
        rt.stabilize()
    calls.clear()
    first_round.set()
    topic.set("t1")
    with pytest.raises(incr.NotAccepted, match="halted"):
        rt.stabilize()
    assert len(calls) == 2                        # the two in flight; none after the halt
    for i in range(4):
        st = rt.state(summary, i)
        assert (st.revision, st.candidate) == (1, f"t0-{i}")   # nothing taken
        assert obs[i].error.reason == "halted"
    rt._check()
    first_round.clear()
    calls.clear()
    rt.resume()
    rt.stabilize()
    assert sorted(calls) == [(i, "t1") for i in range(4)]
    assert [o.value for o in obs] == [f"t1-{i}" for i in range(4)]
    assert all(rt.state(summary, i).revision == 2 for i in range(4))
    rt._check()


# -- what read a halted node, after rt.resume() --------------------------------------------
#
# A halted run is no result: it stopped because of the operator, not because of anything in
# the trace. Whatever met it (a reader node, a plain or async cell -- even one that caught the
# NotAccepted and returned something else) must be recomputed at its next demand after
# rt.resume(), and the invariants (rt._check(), I7 included) hold after every step. Each test
# counts what ran, in the bodies.

def _halted_pair(rt, calls):
    x = rt.input("x", 0)
    y = rt.input("y", 0)

    @incr.llm(version="n0")
    def n0(*, previous=None, feedback=()):
        calls.append("n0")
        return y.get() * 5

    @incr.llm(version="n1")
    def n1(*, previous=None, feedback=()):
        calls.append("n1")
        return x.get() + n0() + 100

    return x, y, n0, n1


def _get(rt, how, fn, *args):
    """fn's value: by a top-level demand, an awaited demand, or through an observer and
    stabilize() (the observer's error raised)."""
    if how == "demand":
        with rt:
            return fn(*args)
    if how == "await":
        async def main():
            return await fn.aget(*args)
        with rt:
            return asyncio.run(main())
    obs = _observers.setdefault((id(rt), fn, args), rt.observe(fn, *args))
    try:
        rt.stabilize()
    except incr.NotAccepted:
        pass
    if obs.error is not None:
        raise obs.error
    return obs.value


_observers: dict = {}


def _ran(how, calls):
    """What ran, in order; under stabilize() once each, sorted: a body whose read of a stale
    LLM node sets the model call aside (to run ahead with others) runs again in the next
    round, so it may be called twice for one recorded run."""
    return sorted(set(calls)) if how == "stabilize" else calls


@pytest.mark.parametrize("how", ["demand", "await", "stabilize"])
def test_a_reader_node_of_a_halted_node_generates_again_after_resume(how):
    rt = incr.Runtime()
    calls = []
    x, y, n0, n1 = _halted_pair(rt, calls)
    assert _get(rt, how, n1) == 100
    calls.clear()
    rt.halt("operator")
    y.set(1)
    with pytest.raises(incr.NotAccepted) as e:
        _get(rt, how, n1)
    assert e.value.reason == "halted"
    assert calls == []                           # no model call while halted
    rt._check()
    rt.resume()
    rt._check()
    assert _get(rt, how, n1) == 105              # not the old 100
    assert _ran(how, calls) == (["n0", "n1"])
    assert (rt.state(n0).revision, rt.state(n1).revision) == (2, 2)
    rt._check()
    calls.clear()
    assert _get(rt, how, n1) == 105              # and then up to date: nothing runs
    assert calls == []
    rt._check()


@pytest.mark.parametrize("how", ["demand", "stabilize"])
@pytest.mark.parametrize("catch", [False, True])
def test_a_plain_cell_that_met_a_halted_node_runs_again_after_resume(how, catch):
    """A plain cell reading the halted node; with catch=True it catches the NotAccepted and
    returns a fallback -- which must not outlive the halt (a from-scratch run after resume
    gives the node's value)."""
    rt = incr.Runtime()
    calls = []
    x, y, n0, n1 = _halted_pair(rt, calls)

    @incr.cell
    def reader():
        calls.append("reader")
        try:
            return n1() * 2
        except incr.NotAccepted as e:
            if not catch:
                raise
            return f"fallback: {e.reason}"

    assert _get(rt, how, reader) == 200
    calls.clear()
    rt.halt("operator")
    y.set(1)
    if catch:
        assert _get(rt, how, reader) == "fallback: halted"
    else:
        with pytest.raises(incr.NotAccepted, match="halted"):
            _get(rt, how, reader)
    assert calls == ["reader"]
    rt._check()
    calls.clear()
    rt.resume()
    rt._check()
    assert _get(rt, how, reader) == 210
    assert _ran(how, calls) == _ran(how, ["reader", "n0", "n1"])
    assert (rt.state(n0).revision, rt.state(n1).revision) == (2, 2)
    rt._check()
    calls.clear()
    assert _get(rt, how, reader) == 210
    assert calls == []
    rt._check()


@pytest.mark.parametrize("how", ["demand", "await", "stabilize"])
def test_an_async_cell_that_met_a_halted_node_runs_again_after_resume(how):
    rt = incr.Runtime()
    calls = []
    x, y, n0, n1 = _halted_pair(rt, calls)

    @incr.cell
    async def reader():
        calls.append("reader")
        await asyncio.sleep(0)
        try:
            return await n1.aget() * 2
        except incr.NotAccepted as e:
            return f"fallback: {e.reason}"

    assert _get(rt, how, reader) == 200
    calls.clear()
    rt.halt("operator")
    y.set(1)
    assert _get(rt, how, reader) == "fallback: halted"
    assert calls == ["reader"]
    rt._check()
    calls.clear()
    rt.resume()
    assert _get(rt, how, reader) == 210
    assert _ran(how, calls) == _ran(how, ["reader", "n0", "n1"])
    assert (rt.state(n0).revision, rt.state(n1).revision) == (2, 2)
    rt._check()
    calls.clear()
    assert _get(rt, how, reader) == 210
    assert calls == []
    rt._check()


def test_halted_readers_under_run_ahead_with_two_workers_generate_after_resume():
    """max_workers=2: two observed reader nodes of one halted upstream node (their calls
    would run ahead together in worker threads)."""
    rt = incr.Runtime(max_workers=2)
    calls = []
    lock = threading.Lock()
    y = rt.input("y", 0)

    @incr.llm(version="up")
    def up(*, previous=None, feedback=()):
        with lock:
            calls.append("up")
        return y.get()

    @incr.llm(version="down")
    def down(i, *, previous=None, feedback=()):
        v = up()
        with lock:
            calls.append(("down", i))
        return v * 10 + i

    obs = [rt.observe(down, i) for i in range(2)]
    rt.stabilize()
    assert [o.value for o in obs] == [0, 1]
    calls.clear()
    rt.halt("operator")
    y.set(1)
    with pytest.raises(incr.NotAccepted, match="halted"):
        rt.stabilize()
    assert calls == []
    assert all(o.error is not None and o.error.reason == "halted" for o in obs)
    rt._check()
    rt.resume()
    rt.stabilize()
    assert [o.value for o in obs] == [10, 11]
    assert sorted(map(str, calls)) == sorted(map(str, ["up", ("down", 0), ("down", 1)]))
    rt._check()
    with rt:
        assert [down(0), down(1)] == [10, 11]
    rt._check()


@pytest.mark.parametrize("how", ["demand", "stabilize"])
def test_a_halted_reader_with_a_store_records_nothing_partial(tmp_path, how):
    """With a store: after the halted pass and resume the value is the new one, and a fresh
    runtime on the same store (a restart) gets it too, with no model call, or else by
    generating -- never the value made before the change."""
    def build(rt, calls):
        return _halted_pair(rt, calls)

    rt = incr.Runtime(store=str(tmp_path / "s"))
    calls = []
    x, y, n0, n1 = build(rt, calls)
    assert _get(rt, how, n1) == 100
    rt.halt("operator")
    y.set(1)
    with pytest.raises(incr.NotAccepted, match="halted"):
        _get(rt, how, n1)
    rt._check()
    # a restart while halted: the store holds nothing of the halted pass
    rt.close()
    rt = incr.Runtime(store=str(tmp_path / "s"))
    calls = []
    x, y, n0, n1 = build(rt, calls)
    y.set(1)
    assert _get(rt, how, n1) == 105
    assert calls == ["n0", "n1"]
    rt._check()
    rt.close()
    # and the same runtime, resumed
    rt = incr.Runtime(store=str(tmp_path / "t"))
    calls = []
    x, y, n0, n1 = build(rt, calls)
    assert _get(rt, how, n1) == 100
    rt.halt("operator")
    y.set(1)
    with pytest.raises(incr.NotAccepted, match="halted"):
        _get(rt, how, n1)
    rt.resume()
    assert _get(rt, how, n1) == 105
    rt._check()
    rt.close()
    rt = incr.Runtime(store=str(tmp_path / "t"))
    calls = []
    x, y, n0, n1 = build(rt, calls)
    y.set(1)
    assert _get(rt, how, n1) == 105
    assert calls == []                            # taken from the store
    rt._check()
    rt.close()


def test_a_fallback_made_while_halted_is_not_taken_from_the_store(tmp_path):
    """A plain cell that caught NotAccepted("halted") and returned a fallback: a restart on
    the same store computes it, it never loads the fallback."""
    def build(rt, calls):
        x, y, n0, n1 = _halted_pair(rt, calls)

        @incr.cell
        def reader():
            calls.append("reader")
            try:
                return n1() * 2
            except incr.NotAccepted:
                return "fallback"
        return y, reader

    rt = incr.Runtime(store=str(tmp_path / "s"))
    calls = []
    y, reader = build(rt, calls)
    with rt:
        assert reader() == 200
    rt.halt("operator")
    y.set(1)
    with rt:
        assert reader() == "fallback"
    rt._check()
    rt.close()
    rt = incr.Runtime(store=str(tmp_path / "s"))
    calls = []
    y, reader = build(rt, calls)
    y.set(1)
    with rt:
        assert reader() == 210
    assert calls == ["n0", "n1", "reader"]
    rt._check()
    rt.close()


@pytest.mark.parametrize("shape", ["observed cells in worker threads", "incr.gather"])
def test_plain_cells_that_met_halted_nodes_concurrently_run_again_after_resume(shape):
    """max_workers=2: the readers of two halted nodes ran in worker threads (two observed
    plain cells), or read them through one incr.gather; each caught the NotAccepted."""
    rt = incr.Runtime(max_workers=2)
    y = rt.input("y", 0)
    calls = []
    lock = threading.Lock()

    def note(what):
        with lock:
            calls.append(what)

    @incr.llm(version="n")
    def node(i, *, previous=None, feedback=()):
        note(f"node {i}")
        return y.get() + i

    @incr.cell
    def reader(i):
        note(f"reader {i}")
        try:
            return node(i) * 10
        except incr.NotAccepted as e:
            return f"fallback: {e.reason}"

    @incr.cell
    def both():
        note("both")
        try:
            return incr.gather(lambda: node(0), lambda: node(1))
        except incr.NotAccepted as e:
            return f"fallback: {e.reason}"

    obs = [rt.observe(reader, i) for i in range(2)] if shape != "incr.gather" \
        else [rt.observe(both)]
    rt.stabilize()
    before = [o.value for o in obs]
    assert before == ([0, 10] if shape != "incr.gather" else [[0, 1]])
    calls.clear()
    rt.halt("operator")
    y.set(1)
    try:
        rt.stabilize()
    except incr.NotAccepted:
        pass
    assert [o.value for o in obs] == ["fallback: halted"] * len(obs)
    assert not any(c.startswith("node") for c in calls)
    rt._check()
    calls.clear()
    rt.resume()
    rt.stabilize()
    assert [o.value for o in obs] == ([10, 20] if shape != "incr.gather" else [[1, 2]])
    assert sorted(set(calls)) == (["node 0", "node 1", "reader 0", "reader 1"]
                                  if shape != "incr.gather" else ["both", "node 0", "node 1"])
    assert [rt.state(node, i).revision for i in range(2)] == [2, 2]
    rt._check()
    calls.clear()
    rt.stabilize()
    assert calls == []
    rt._check()


@pytest.mark.parametrize("how", ["sync", "aget", "astabilize"])
def test_async_nodes_and_an_async_reader_that_met_the_halt_run_again_after_resume(how):
    """The same with async generators (n1 awaits n0) and an observed async cell that catches
    the NotAccepted; demanded from sync code, awaited, or through astabilize()."""
    rt = incr.Runtime()
    calls = []
    x = rt.input("x", 0)
    y = rt.input("y", 0)

    @incr.llm(version="a0")
    async def n0(*, previous=None, feedback=()):
        calls.append("n0")
        await asyncio.sleep(0)
        return y.get() * 5

    @incr.llm(version="a1")
    async def n1(*, previous=None, feedback=()):
        calls.append("n1")
        v = await n0.aget()
        await asyncio.sleep(0)
        return x.get() + v + 100

    @incr.cell
    async def reader():
        calls.append("reader")
        try:
            return await n1.aget() * 2
        except incr.NotAccepted as e:
            return f"fallback: {e.reason}"

    obs = rt.observe(reader)

    def get():
        if how == "sync":
            with rt:
                return reader()
        if how == "aget":
            async def main():
                with rt:
                    return await reader.aget()
            return asyncio.run(main())

        async def main():
            await rt.astabilize()
        asyncio.run(main())
        return obs.value

    assert get() == 200
    rt.halt("operator")
    y.set(1)
    calls.clear()
    assert get() == "fallback: halted"
    assert calls == ["reader"]
    rt._check()
    rt.resume()
    calls.clear()
    assert get() == 210
    assert sorted(set(calls)) == ["n0", "n1", "reader"]
    assert (rt.state(n0).revision, rt.state(n1).revision) == (2, 2)
    rt._check()
    calls.clear()
    assert get() == 210
    assert calls == []
    rt._check()
