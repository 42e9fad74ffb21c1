"""Exceptions: the caller gets the very exception the cell raised (with a note naming the cell),
nothing partial is kept, a failed instance runs again at the next demand, and within one pass it
runs at most once."""

from __future__ import annotations

import pytest

import incr
from conftest import label


class Boom(Exception):
    pass


def notes(e):
    return getattr(e, "__notes__", [])


def test_exception_reaches_the_caller_unchanged_with_a_note(rt, log):
    x = rt.input("x", 0)
    raised = []

    @incr.cell
    def fragile():
        log("fragile")
        if x.get() == 0:
            e = Boom("zero")
            raised.append(e)
            raise e
        return x.get()

    with rt:
        with pytest.raises(Boom) as info:
            fragile()
    assert info.value is raised[0]
    assert info.type is Boom
    assert str(info.value) == "zero"
    assert any("incr: raised in cell" in n for n in notes(info.value))
    assert any(n.startswith(f"incr: raised in cell {label(fragile)}") for n in notes(info.value))


def test_note_names_the_cell_where_it_was_raised(rt):
    x = rt.input("x", 0)

    @incr.cell
    def inner(k):
        return 10 // x.get()

    @incr.cell
    def outer():
        return inner(3) + 1

    with rt:
        with pytest.raises(ZeroDivisionError) as info:
            outer()
    ours = [n for n in notes(info.value) if n.startswith("incr:")]
    assert ours, notes(info.value)
    assert ours[0].startswith(f"incr: raised in cell {label(inner, 3)}")
    assert label(outer) in " ".join(ours)


def test_nothing_partial_is_kept_and_it_runs_again(rt, log):
    x = rt.input("x", 1)

    @incr.cell
    def inv():
        log("inv")
        return 1 / x.get()

    @incr.cell
    def user():
        log("user")
        return inv() * 2

    with rt:
        assert user() == 2.0
        log.take()
        x.set(0)
        with pytest.raises(ZeroDivisionError):
            user()
        assert log.take() == ["inv", "user"]
        # no old value is served, and each top-level demand runs the failed instances again
        with pytest.raises(ZeroDivisionError):
            user()
        assert log.take() == ["user", "inv"]
        with pytest.raises(ZeroDivisionError):
            inv()
        assert log.take() == ["inv"]
        x.set(1)  # back to the value it had when it last succeeded
        assert user() == 2.0
        assert log.counts() == {"inv": 1, "user": 1}
        assert user() == 2.0
        assert log.take() == []


def test_runtime_stays_usable_after_an_exception(rt, log):
    x = rt.input("x", 0)
    y = rt.input("y", 5)

    @incr.cell
    def bad():
        return 1 // x.get()

    @incr.cell
    def good():
        log("good")
        return y.get() + 1

    with rt:
        with pytest.raises(ZeroDivisionError):
            bad()
        assert good() == 6
        y.set(6)
        assert good() == 7
        assert log.take() == ["good", "good"]
        rt._check()
        x.set(1)
        assert bad() == 1


def test_a_failed_first_run_leaves_no_instance_value(rt, log):
    x = rt.input("x", 0)

    @incr.cell
    def first():
        log("first")
        if x.get() == 0:
            raise Boom("not yet")
        return "ok"

    with rt:
        with pytest.raises(Boom):
            first()
        assert "raised" in rt.explain(first)
        x.set(1)
        assert first() == "ok"
        assert log.take() == ["first", "first"]
    assert rt.stats()["failed"] == 1


def test_a_catching_cell_is_invalidated_when_the_failing_dependency_changes(rt, log):
    d = rt.input("d", 0)

    @incr.cell
    def risky():
        log("risky")
        return 10 / d.get()

    @incr.cell
    def safe():
        log("safe")
        try:
            return risky()
        except ZeroDivisionError:
            return "fallback"

    with rt:
        assert safe() == "fallback"
        assert log.take() == ["safe", "risky"]
        assert safe() == "fallback"
        assert log.take() == []
        d.set(5)
        assert safe() == 2.0
        assert log.counts() == {"safe": 1, "risky": 1}
        d.set(0)
        assert safe() == "fallback"
        assert log.counts() == {"safe": 1, "risky": 1}


def test_demanding_the_failed_dependency_again_keeps_the_trace_consistent(rt, log):
    d = rt.input("d", 0)
    unrelated = rt.input("unrelated", 0)

    @incr.cell
    def risky():
        log("risky")
        return 10 / d.get()

    @incr.cell
    def safe():
        log("safe")
        try:
            return risky()
        except ZeroDivisionError:
            return "fallback"

    with rt:
        assert safe() == "fallback"
        unrelated.set(1)  # the clock moves on
        with pytest.raises(ZeroDivisionError):
            risky()  # a new top-level demand runs it again; it fails again
        assert log.take() == ["safe", "risky", "risky"]
        rt._check()
        assert safe() == "fallback"
        rt._check()
        d.set(2)
        assert safe() == 5.0
        assert log.counts() == {"safe": 1, "risky": 1}


def test_failing_instance_runs_once_per_top_level_demand(rt, log):
    d = rt.input("d", 1)

    @incr.cell
    def risky():
        log("risky")
        return 10 // d.get()

    @incr.cell
    def safe(tag):
        log(f"safe({tag})")
        try:
            return risky()
        except ZeroDivisionError:
            return tag

    @incr.cell
    def both():
        log("both")
        return [safe("a"), safe("b")]

    with rt:
        assert both() == [10, 10]
        log.take()
        d.set(0)
        assert both() == ["a", "b"]
        assert log.counts() == {"both": 1, "safe(a)": 1, "safe(b)": 1, "risky": 1}


def test_failing_instance_runs_once_per_stabilize(rt, log):
    d = rt.input("d", 1)

    @incr.cell
    def risky():
        log("risky")
        return 10 // d.get()

    @incr.cell
    def reader(k):
        log(f"reader({k})")
        return risky() + k

    o1 = rt.observe(reader, 1)
    o2 = rt.observe(reader, 2)
    log.take()
    d.set(0)
    with pytest.raises(ZeroDivisionError) as info:
        rt.stabilize()
    assert log.counts() == {"risky": 1, "reader(1)": 1, "reader(2)": 1}
    assert any("incr: raised in cell" in n for n in notes(info.value))
    # the next stabilize is a new pass: the failed instances run again (the stale observers
    # are still stale)
    d.set(2)
    rt.stabilize()
    assert (o1.value, o2.value) == (6, 7)
    assert log.counts() == {"risky": 1, "reader(1)": 1, "reader(2)": 1}


def test_failing_instance_read_by_catching_observers_runs_once_per_stabilize(rt, log):
    d = rt.input("d", 1)

    @incr.cell
    def risky():
        log("risky")
        return 10 // d.get()

    @incr.cell
    def safe(k):
        log(f"safe({k})")
        try:
            return risky() + k
        except ZeroDivisionError:
            return -k

    o1 = rt.observe(safe, 1)
    o2 = rt.observe(safe, 2)
    got = []
    o1.on_change(got.append)
    o2.on_change(got.append)
    log.take()
    d.set(0)
    report = rt.stabilize()
    assert log.counts() == {"risky": 1, "safe(1)": 1, "safe(2)": 1}
    assert sorted(got) == [-2, -1]
    assert label(risky) in report.recomputed
    assert (o1.value, o2.value) == (-1, -2)


def test_other_observers_are_still_updated_when_one_raises(rt, log):
    d = rt.input("d", 1)

    @incr.cell
    def bad():
        log("bad")
        return 10 // d.get()

    @incr.cell
    def fine():
        log("fine")
        return d.get() * 3

    rt.observe(bad)
    o_fine = rt.observe(fine)
    got = []
    o_fine.on_change(got.append)
    log.take()
    d.set(0)
    with pytest.raises(ZeroDivisionError):
        rt.stabilize()
    assert log.counts() == {"bad": 1, "fine": 1}
    assert got == [0]
    assert o_fine.value == 0
    assert log.take() == []


def test_base_exceptions_other_than_exception_also_leave_the_runtime_usable(rt, log):
    x = rt.input("x", 0)

    @incr.cell
    def interrupted():
        log("interrupted")
        if x.get() == 0:
            raise KeyboardInterrupt
        return x.get()

    with rt:
        with pytest.raises(KeyboardInterrupt):
            interrupted()
        rt._check()
        x.set(3)
        assert interrupted() == 3
        assert log.take() == ["interrupted", "interrupted"]
