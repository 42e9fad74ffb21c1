"""rt.halt(reason) / rt.resume(): an operator's stop outside the model. Every running LLM loop
stops before its next generator call with NotAccepted(reason="halted") whose report names the
reason; nothing partial is recorded; the runtime stays usable; after rt.resume() the same
demand goes on. rt.halt only sets a flag: it works from another thread and from a signal
handler. Synchronisation is by events and barriers, never by timing."""

from __future__ import annotations

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
