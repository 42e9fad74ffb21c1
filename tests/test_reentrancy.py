"""Changes happen between computations, never during them: Input.set, rt.batch(), rt.stabilize()
and rt.observe() from inside a running cell raise incr.ReentrancyError."""

from __future__ import annotations

import pytest

import incr
from conftest import label


def test_reentrancy_error_is_an_incr_error():
    assert issubclass(incr.ReentrancyError, incr.IncrError)


def make(rt, log, action):
    x = rt.input("x", 1)
    other = rt.input("other", 0)

    @incr.cell
    def helper():
        return 5

    @incr.cell
    def meddler():
        log("meddler")
        v = x.get()
        action(rt, x, other, helper)
        log("not reached")
        return v

    return x, other, meddler


ACTIONS = {
    "set_unread_input": lambda rt, x, other, helper: other.set(99),
    "set_input_it_read": lambda rt, x, other, helper: x.set(x.get() + 1),
    "batch": lambda rt, x, other, helper: _with_batch(rt),
    "stabilize": lambda rt, x, other, helper: rt.stabilize(),
    "observe": lambda rt, x, other, helper: rt.observe(helper),
}


def _with_batch(rt):
    with rt.batch():
        pass


@pytest.mark.parametrize("what", sorted(ACTIONS))
def test_change_from_inside_a_running_cell_raises(rt, log, what):
    x, other, meddler = make(rt, log, ACTIONS[what])
    with rt:
        with pytest.raises(incr.ReentrancyError) as info:
            meddler()
    assert isinstance(info.value, incr.IncrError)
    assert label(meddler) in str(info.value) or any(
        label(meddler) in n for n in getattr(info.value, "__notes__", []))
    assert log.take() == ["meddler"]
    # nothing changed, and the runtime is usable
    assert rt.revision == 0
    assert (x.get(), other.get()) == (1, 0)
    rt._check()
    x.set(2)
    assert rt.revision == 1
    with rt:
        with pytest.raises(incr.ReentrancyError):
            meddler()
    assert log.take() == ["meddler"]


def test_set_from_a_nested_cell_raises(rt, log):
    x = rt.input("x", 1)

    @incr.cell
    def deep():
        log("deep")
        x.set(x.get() + 1)
        return 0

    @incr.cell
    def shallow():
        log("shallow")
        return deep() + 1

    with rt:
        with pytest.raises(incr.ReentrancyError):
            shallow()
    assert log.take() == ["shallow", "deep"]
    assert x.get() == 1
    assert rt.revision == 0


def test_reentrancy_during_stabilize(rt, log):
    x = rt.input("x", 1)
    other = rt.input("other", 0)

    @incr.cell
    def meddler():
        log("meddler")
        if x.get() > 1:
            other.set(x.get())
        return x.get()

    o = rt.observe(meddler)
    x.set(2)
    with pytest.raises(incr.ReentrancyError):
        rt.stabilize()
    assert other.get() == 0
    assert log.take() == ["meddler"]
    x.set(1)
    rt.stabilize()
    assert o.value == 1


def test_input_set_allowed_again_after_the_cell_returns(rt, log):
    x = rt.input("x", 1)

    @incr.cell
    def reader():
        log("reader")
        return x.get()

    with rt:
        assert reader() == 1
        x.set(2)  # between computations: fine
        assert reader() == 2
        with rt.batch():
            x.set(3)
        assert reader() == 3
    assert log.take() == ["reader"] * 3
