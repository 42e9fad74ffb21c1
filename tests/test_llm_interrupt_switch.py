"""Ctrl-C while an LLM node's run switches over (incr/llmnodes.py _Loop.run, _loop_on): the
switch is undone as a whole and the next run makes it again (see tests/test_attack_v3.py for
the findings these extend)."""

import sys

import pytest

import incr


def _interrupt(rt, tracer):
    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        with pytest.raises(KeyboardInterrupt):
            rt.stabilize()
    finally:
        sys.settrace(old)


def _at_call(fn_name, nth=1):
    seen, fired = [], []

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code.co_name == fn_name and not fired:
            seen.append(1)
            if len(seen) == nth:
                fired.append(1)
                sys.settrace(None)
                raise KeyboardInterrupt
        return None
    return tracer, fired


def _at_line(fn_name, text):
    import linecache
    fired = []

    def tracer(frame, event, arg):
        if fired:
            return None
        if frame.f_code.co_name != fn_name:
            return tracer
        if event == "line" and linecache.getline(frame.f_code.co_filename,
                                                 frame.f_lineno).strip() == text:
            fired.append(frame.f_lineno)
            sys.settrace(None)
            raise KeyboardInterrupt
        return tracer
    return tracer, fired


def _node(rt, calls, validated=True):
    x = rt.input("x", 1)

    @incr.validator
    def matches(candidate):
        calls.append(("v", candidate))
        yield (incr.ACK("ok") if candidate == x.get() * 10
               else incr.NACK("ok", counterexample=candidate))

    @incr.llm(validators=[matches] if validated else [])
    def gen(*, previous=None, feedback=()):
        calls.append(("g", x.get()))
        return x.get() * 10

    return x, gen


@pytest.mark.parametrize("validated", [True, False])
def test_an_interrupt_halfway_through_recording_a_revision_undoes_it(validated):
    # between two plain stores of _loop_on's record (no call to trace: a signal's Ctrl-C)
    rt = incr.Runtime(max_workers=1)
    calls = []
    x, gen = _node(rt, calls, validated)
    o = rt.observe(gen)
    rt.stabilize()
    before = rt.state(gen)
    x.set(2)
    tracer, fired = _at_line("_loop_on", "st.values[st.revision] = cand")
    _interrupt(rt, tracer)
    assert fired
    mid = rt.state(gen)
    assert (mid.revision, mid.candidate) == (before.revision, before.candidate)
    rt.stabilize()                  # generates again: not an "oscillation"
    assert o.value == 20
    assert rt.state(gen).status == ("stable" if validated else "unvalidated")
    assert rt.state(gen).revision == before.revision + 1
    rt._check()


@pytest.mark.parametrize("where", ["_new_epoch", "_fresh_budget", "_fingerprint"])
def test_an_interrupted_switch_leaves_the_nodes_state_as_it_was(where):
    rt = incr.Runtime(max_workers=1)
    calls = []
    x, gen = _node(rt, calls)
    o = rt.observe(gen)
    rt.stabilize()
    x.set(2)
    rt.stabilize()                  # a second context: history and attempts to keep
    st = rt.llm.nodes[next(iter(rt.llm.nodes))]
    before = (st.epoch, len(st.history), len(st.attempts), dict(st.ledger), st.status,
              st.revision, dict(st.fingerprints), st.pending)
    x.set(3)
    tracer, fired = _at_call(where)
    _interrupt(rt, tracer)
    assert fired
    assert (st.epoch, len(st.history), len(st.attempts), dict(st.ledger), st.status,
            st.revision, dict(st.fingerprints), st.pending) == before
    del calls[:]
    rt.stabilize()
    assert o.value == 30 and rt.state(gen).status == "stable"
    assert calls == [("v", 20), ("g", 3), ("v", 30)], calls   # asked, NACKed, regenerated
    rt._check()
