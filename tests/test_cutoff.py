"""Early cutoff: a recomputed value that counts as unchanged (per the cell's cutoff) keeps the old
value, and nothing that read it runs."""

from __future__ import annotations

import pytest

import incr
from conftest import label


def test_equal_is_the_default_and_stops_downstream(rt, log):
    x = rt.input("x", 1)

    @incr.cell
    def parity():
        log("parity")
        return x.get() % 2

    @incr.cell
    def word():
        log("word")
        return "odd" if parity() else "even"

    @incr.cell
    def loud():
        log("loud")
        return word().upper()

    assert parity.cutoff is incr.EQUAL
    with rt:
        assert loud() == "ODD"
        log.take()
        x.set(3)
        assert loud() == "ODD"
        assert log.take() == ["parity"]
        x.set(4)
        assert loud() == "EVEN"
        assert log.take() == ["parity", "word", "loud"]


def test_on_cutoff_the_old_value_is_kept(rt, log):
    x = rt.input("x", 1)

    @incr.cell
    def listed():
        log("listed")
        return [x.get() % 2]

    with rt:
        first = listed()
        x.set(3)
        again = listed()
        assert log.take() == ["listed", "listed"]
        assert again == [1]
        assert again is first


def test_equal_needs_the_same_type(rt, log):
    x = rt.input("x", 1)

    @incr.cell
    def value():
        log("value")
        return x.get()

    @incr.cell
    def user():
        log("user")
        return repr(value())

    with rt:
        assert user() == "1"
        log.take()
        x.set(1.0)
        assert user() == "1.0"
        assert log.take() == ["value", "user"]
        x.set(True)
        assert user() == "True"
        assert log.take() == ["value", "user"]


def test_equal_cell_value_of_another_type_is_a_change(rt, log):
    # the input changes in a way that makes the cell return 1.0 where it returned 1
    x = rt.input("x", "int")

    @incr.cell
    def one():
        log("one")
        return 1 if x.get() == "int" else 1.0

    @incr.cell
    def user():
        log("user")
        return type(one()).__name__

    with rt:
        assert user() == "int"
        log.take()
        x.set("float")
        assert user() == "float"
        assert log.take() == ["one", "user"]
        x.set("float too")  # one() still returns 1.0: cut off
        assert user() == "float"
        assert log.take() == ["one"]


def test_identity_cutoff(rt, log):
    x = rt.input("x", 1)
    shared = ("shared",)

    @incr.cell(cutoff=incr.IDENTITY)
    def fresh():
        log("fresh")
        x.get()
        return ["equal"]  # a new, equal list on every run

    @incr.cell(cutoff=incr.IDENTITY)
    def same():
        log("same")
        x.get()
        return shared

    @incr.cell
    def after_fresh():
        log("after_fresh")
        return len(fresh())

    @incr.cell
    def after_same():
        log("after_same")
        return len(same())

    with rt:
        after_fresh(), after_same()
        log.take()
        x.set(2)
        after_fresh(), after_same()
        assert log.counts() == {"fresh": 1, "after_fresh": 1, "same": 1}


def test_never_cutoff_always_propagates(rt, log):
    x = rt.input("x", 1)

    @incr.cell(cutoff=incr.NEVER)
    def parity():
        log("parity")
        return x.get() % 2

    @incr.cell
    def user():
        log("user")
        return parity() + 1

    with rt:
        assert user() == 2
        log.take()
        x.set(3)
        assert user() == 2
        assert log.take() == ["parity", "user"]


def test_callable_cutoff_gets_old_then_new_and_keeps_old(rt, log):
    x = rt.input("x", 10.0)
    calls = []

    def close_enough(old, new):
        calls.append((old, new))
        return abs(old - new) < 1

    @incr.cell(cutoff=close_enough)
    def reading():
        log("reading")
        return x.get()

    @incr.cell
    def display():
        log("display")
        return f"{reading():.1f}"

    with rt:
        assert display() == "10.0"
        assert calls == []  # no old value to compare on the first run
        log.take()
        x.set(10.4)
        assert display() == "10.0"
        assert reading() == 10.0  # the old value is kept
        assert log.take() == ["reading"]
        assert calls == [(10.0, 10.4)]
        x.set(12.0)
        assert display() == "12.0"
        assert log.take() == ["reading", "display"]
        assert calls[-1] == (10.0, 12.0)  # compared with the kept value


def test_callable_cutoff_result_is_taken_as_truth(rt, log):
    x = rt.input("x", 1)

    @incr.cell(cutoff=lambda old, new: True)
    def frozen():
        log("frozen")
        return x.get()

    @incr.cell
    def user():
        log("user")
        return frozen()

    with rt:
        assert user() == 1
        log.take()
        x.set(2)
        assert user() == 1
        assert log.take() == ["frozen"]


def test_cutoff_reported_by_explain_and_stabilize(rt, log):
    x = rt.input("x", 1)

    @incr.cell
    def parity():
        log("parity")
        return x.get() % 2

    @incr.cell
    def word():
        log("word")
        return "odd" if parity() else "even"

    o = rt.observe(word)
    rt.stabilize()
    log.take()
    x.set(3)
    report = rt.stabilize()
    assert log.take() == ["parity"]
    assert report.recomputed == [label(parity)]
    assert report.cutoff == [label(parity)]
    assert report.reused == 1  # word() was verified without running
    text = rt.explain(parity)
    assert "cutoff" in text
    assert "input 'x'" in text
    assert "reused" in rt.explain(word)
    assert o.value == "odd"


def test_bad_cutoff_is_a_type_error():
    with pytest.raises(TypeError, match="cutoff"):

        @incr.cell(cutoff="sometimes")
        def f():
            return 1


@pytest.mark.hang_limit(30)
def test_a_cutoff_callable_that_raises_never_hangs_the_runtime(rt, log):
    # The contract does not say whether a raising cutoff means "changed" or reaches the caller
    # like an exception of the cell; either is accepted. A hang or a broken trace is not.
    x = rt.input("x", 1)

    def broken(old, new):
        raise ValueError("cutoff broke")

    @incr.cell(cutoff=broken)
    def reading():
        log("reading")
        return x.get()

    @incr.cell
    def user():
        log("user")
        return reading() + 1

    with rt:
        assert user() == 2
        log.take()
        x.set(2)
        try:
            result = user()
        except ValueError as e:
            assert str(e) == "cutoff broke"
        else:
            assert result == 3
        assert log.counts()["reading"] == 1
        rt._check()
        x.set(3)
        try:
            assert user() == 4
        except ValueError:
            pass
        rt._check()
