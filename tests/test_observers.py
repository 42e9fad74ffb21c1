"""Observers and stabilize(): observed instances are brought up to date in one pass, then the
callbacks of those whose value changed are called, once, with everything already consistent."""

from __future__ import annotations

import pytest

import incr
from conftest import label


def test_observe_computes_nothing_until_stabilize(rt, log):
    x = rt.input("x", 2)

    @incr.cell
    def sq():
        log("sq")
        return x.get() ** 2

    o = rt.observe(sq)
    assert log.take() == []
    report = rt.stabilize()
    assert log.take() == ["sq"] and report.recomputed == [label(sq)]
    assert o.value == 4
    assert log.take() == []
    # observing an instance that is already computed runs nothing
    o2 = rt.observe(sq)
    assert log.take() == []
    assert o2.value == 4


def test_observe_with_arguments(rt, log):
    x = rt.input("x", 2)

    @incr.cell
    def power(k, offset=0):
        log((k, offset))
        return x.get() ** k + offset

    o = rt.observe(power, 3, offset=1)
    assert o.value == 9
    with rt:
        assert power(3, 1) == 9
    assert log.take() == [(3, 1)]


def test_value_is_always_current(rt, log):
    x = rt.input("x", 2)

    @incr.cell
    def sq():
        log("sq")
        return x.get() ** 2

    o = rt.observe(sq)
    log.take()
    x.set(3)
    assert o.value == 9  # pulls without a stabilize
    assert log.take() == ["sq"]
    assert o.value == 9
    assert log.take() == []


def test_stabilize_report(rt, log):
    x = rt.input("x", 1)
    y = rt.input("y", 100)

    @incr.cell
    def parity():
        log("parity")
        return x.get() % 2

    @incr.cell
    def word():
        log("word")
        return "odd" if parity() else "even"

    @incr.cell
    def plus():
        log("plus")
        return x.get() + 1

    @incr.cell
    def times():
        log("times")
        return plus() * 2

    @incr.cell
    def other():
        log("other")
        return y.get()

    rt.observe(word)
    rt.observe(times)
    rt.observe(other)
    assert log.take() == []
    first = rt.stabilize()           # observing computed nothing: the first pass does
    assert sorted(first.recomputed) == sorted(label(c) for c in (parity, word, plus, times,
                                                                  other))
    log.take()

    empty = rt.stabilize()
    assert (empty.recomputed, empty.cutoff, empty.reused) == ([], [], 0)
    assert empty.revision == 0
    assert empty.seconds >= 0

    x.set(3)
    report = rt.stabilize()
    assert isinstance(report, incr.Stabilization)
    ran = log.take()
    assert sorted(ran) == ["parity", "plus", "times"]
    assert ran.index("plus") < ran.index("times")
    assert sorted(report.recomputed) == sorted([label(parity), label(plus), label(times)])
    assert report.recomputed.index(label(plus)) < report.recomputed.index(label(times))
    assert report.cutoff == [label(parity)]
    assert report.reused == 1  # word()
    assert report.revision == 1
    assert report.seconds >= 0

    again = rt.stabilize()
    assert (again.recomputed, again.cutoff, again.reused) == ([], [], 0)
    assert log.take() == []


def test_recomputed_labels_are_in_run_order(rt, log):
    x = rt.input("x", 1)

    @incr.cell
    def step(i):
        v = x.get() if i == 0 else step(i - 1) + 1
        log(i)
        return v

    rt.observe(step, 4)
    rt.stabilize()
    log.take()
    x.set(10)
    report = rt.stabilize()
    assert log.take() == [0, 1, 2, 3, 4]
    assert report.recomputed == [label(step, i) for i in range(5)]


def test_callbacks_fire_once_per_changing_stabilize(rt, log):
    x = rt.input("x", 1)

    @incr.cell
    def sq():
        log("sq")
        return x.get() ** 2

    o = rt.observe(sq)
    got = []
    cb = got.append
    assert o.on_change(cb) is cb  # usable as a decorator
    rt.stabilize()
    assert got == [1]  # the first value: observing computed nothing
    rt.stabilize()
    assert got == [1]  # nothing changed since
    x.set(2)
    x.set(3)
    rt.stabilize()
    assert got == [1, 9]
    rt.stabilize()
    assert got == [1, 9]
    x.set(-3)  # recomputed, but equal: cut off
    rt.stabilize()
    assert got == [1, 9]
    x.set(4)
    rt.stabilize()
    assert got == [1, 9, 16]


def test_value_pulled_before_stabilize_is_still_notified(rt, log):
    x = rt.input("x", 1)

    @incr.cell
    def sq():
        log("sq")
        return x.get() ** 2

    o = rt.observe(sq)
    got = []
    o.on_change(got.append)
    x.set(5)
    assert o.value == 25             # not computed yet: reading the value stabilizes
    assert got == [25]
    rt.stabilize()
    assert got == [25]
    x.set(6)
    with rt:
        assert sq() == 36            # pulled by a plain demand, outside any pass
    rt.stabilize()
    assert got == [25, 36]           # still notified by the next pass
    assert log.counts() == {"sq": 2}


def test_no_callback_when_the_value_is_cut_off(rt, log):
    x = rt.input("x", 1)

    @incr.cell
    def parity():
        log("parity")
        return x.get() % 2

    @incr.cell
    def word():
        log("word")
        return "odd" if parity() else "even"

    o_word = rt.observe(word)
    o_par = rt.observe(parity)
    rt.stabilize()
    calls = []
    o_word.on_change(lambda v: calls.append(("word", v)))
    o_par.on_change(lambda v: calls.append(("parity", v)))
    log.take()
    x.set(5)
    report = rt.stabilize()
    assert calls == []
    assert log.take() == ["parity"]
    assert report.cutoff == [label(parity)]


def test_callbacks_run_after_all_observed_instances_are_up_to_date(rt, log):
    x = rt.input("x", 1)
    events = []

    @incr.cell
    def low():
        events.append("run low")
        return x.get() + 1

    @incr.cell
    def high():
        events.append("run high")
        return low() * 100

    @incr.cell
    def aside():
        events.append("run aside")
        return -x.get()

    o_low = rt.observe(low)
    o_high = rt.observe(high)
    o_aside = rt.observe(aside)
    seen = []

    def on_low(v):
        events.append("cb low")
        seen.append(("low", v, o_high.value, o_aside.value))

    def on_high(v):
        events.append("cb high")
        seen.append(("high", v, o_low.value, o_aside.value))

    o_low.on_change(on_low)
    o_high.on_change(on_high)
    events.clear()
    x.set(5)
    rt.stabilize()
    runs = [e for e in events if e.startswith("run")]
    cbs = [e for e in events if e.startswith("cb")]
    assert sorted(runs) == ["run aside", "run high", "run low"]
    assert sorted(cbs) == ["cb high", "cb low"]
    # every run happened before the first callback: callbacks read, they never compute
    assert events.index(cbs[0]) == len(runs)
    assert sorted(seen) == [("high", 600, 6, -5), ("low", 6, 600, -5)]


def test_two_observers_of_one_instance_each_notified_once(rt):
    x = rt.input("x", 1)

    @incr.cell
    def ident():
        return x.get()

    o1 = rt.observe(ident)
    o2 = rt.observe(ident)
    got1, got2 = [], []
    o1.on_change(got1.append)
    o2.on_change(got2.append)
    o2.on_change(got2.append)
    x.set(2)
    rt.stabilize()
    assert got1 == [2]
    assert got2 == [2, 2]  # each registered callback once


def test_stop(rt, log):
    x = rt.input("x", 1)

    @incr.cell
    def sq():
        log("sq")
        return x.get() ** 2

    o = rt.observe(sq)
    got = []
    o.on_change(got.append)
    log.take()
    o.stop()
    o.stop()  # idempotent
    x.set(2)
    report = rt.stabilize()
    assert report.recomputed == []
    assert log.take() == []
    assert got == []
    with rt:
        assert sq() == 4  # still an ordinary cell
    assert log.take() == ["sq"]


def test_stop_one_of_two_observers(rt, log):
    x = rt.input("x", 1)

    @incr.cell
    def sq():
        log("sq")
        return x.get() ** 2

    o1, o2 = rt.observe(sq), rt.observe(sq)
    got1, got2 = [], []
    o1.on_change(got1.append)
    o2.on_change(got2.append)
    o1.stop()
    x.set(3)
    report = rt.stabilize()
    assert report.recomputed == [label(sq)]
    assert (got1, got2) == ([], [9])


def test_on_change_needs_a_callable(rt):
    x = rt.input("x", 1)

    @incr.cell
    def f():
        return x.get()

    o = rt.observe(f)
    with pytest.raises(TypeError):
        o.on_change(42)
