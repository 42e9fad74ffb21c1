"""Cycles: a cell that demands itself, directly or through others, raises incr.CycleError naming
the cycle; the runtime stays usable."""

from __future__ import annotations

import pytest

import incr
from conftest import label

# a cycle must end in CycleError, never in a hang: fail fast if it does not
pytestmark = pytest.mark.hang_limit(30)


def test_cycle_error_is_an_incr_error():
    assert issubclass(incr.CycleError, incr.IncrError)


def test_direct_cycle(rt, log):
    @incr.cell
    def selfish():
        log("selfish")
        return selfish() + 1

    with rt:
        with pytest.raises(incr.CycleError) as info:
            selfish()
    assert info.value.cycle == [label(selfish), label(selfish)]
    assert label(selfish) in str(info.value)
    assert log.take() == ["selfish"]


def test_direct_cycle_through_another_argument(rt):
    @incr.cell
    def countdown(n):
        return countdown(n - 1) if n > 0 else countdown(2)

    with rt:
        with pytest.raises(incr.CycleError) as info:
            countdown(2)
    assert info.value.cycle == [label(countdown, 2), label(countdown, 1), label(countdown, 0),
                                label(countdown, 2)]


def test_indirect_cycle(rt, log):
    @incr.cell
    def a():
        log("a")
        return b() + 1

    @incr.cell
    def b():
        log("b")
        return c() + 1

    @incr.cell
    def c():
        log("c")
        return a() + 1

    with rt:
        with pytest.raises(incr.CycleError) as info:
            a()
    cycle = info.value.cycle
    assert cycle == [label(a), label(b), label(c), label(a)]
    assert log.take() == ["a", "b", "c"]
    with rt:
        with pytest.raises(incr.CycleError) as info:
            b()
    assert info.value.cycle[0] == info.value.cycle[-1] == label(b)
    assert set(info.value.cycle) == {label(a), label(b), label(c)}


def test_cycle_error_can_be_caught_by_the_caller_and_runtime_is_usable(rt, log):
    x = rt.input("x", 1)

    @incr.cell
    def loop():
        return loop()

    @incr.cell
    def fine():
        log("fine")
        return x.get() * 2

    with rt:
        with pytest.raises(incr.CycleError):
            loop()
        assert fine() == 2
        x.set(2)
        assert fine() == 4
        with pytest.raises(incr.CycleError):
            loop()  # still a cycle on the next demand, not a stale value
    assert log.take() == ["fine", "fine"]


def test_cycle_that_appears_after_an_input_change(rt, log):
    closed = rt.input("closed", False)
    x = rt.input("x", 10)

    @incr.cell
    def a():
        log("a")
        return b() + 1

    @incr.cell
    def b():
        log("b")
        return a() if closed.get() else x.get()

    with rt:
        assert a() == 11
        log.take()
        closed.set(True)
        with pytest.raises(incr.CycleError) as info:
            a()
        cycle = info.value.cycle
        assert cycle[0] == cycle[-1]
        assert set(cycle) == {label(a), label(b)}
        rt._check()
        # the same from the other end
        with pytest.raises(incr.CycleError) as info:
            b()
        assert info.value.cycle[0] == info.value.cycle[-1]
        assert set(info.value.cycle) == {label(a), label(b)}
        rt._check()
        log.take()
        closed.set(False)
        assert a() == 11
        assert log.counts() == {"a": 1, "b": 1}
        x.set(20)
        assert a() == 21
        assert b() == 20
        assert log.counts() == {"a": 1, "b": 1}


def test_cycle_through_stabilize(rt, log):
    closed = rt.input("closed", False)

    @incr.cell
    def a():
        log("a")
        return b() + 1

    @incr.cell
    def b():
        log("b")
        return a() if closed.get() else 0

    o = rt.observe(a)
    got = []
    o.on_change(got.append)
    closed.set(True)
    with pytest.raises(incr.CycleError) as info:
        rt.stabilize()
    assert set(info.value.cycle) == {label(a), label(b)}
    rt._check()
    closed.set(False)
    rt.stabilize()
    assert o.value == 1
    # the value went 1 -> (failed) -> 1: the observer was told nothing new, or told 1
    assert got in ([], [1])
