"""Batches: every set inside ``with rt.batch()`` forms one revision, and what depends on several
of those inputs runs once."""

from __future__ import annotations

import pytest

import incr
from conftest import label


def make_sum(rt, log):
    a = rt.input("a", 1)
    b = rt.input("b", 2)
    c = rt.input("c", 3)

    @incr.cell
    def total():
        log("total")
        return a.get() + b.get() + c.get()

    return a, b, c, total


def test_several_sets_make_one_revision(rt, log):
    a, b, c, total = make_sum(rt, log)
    with rt:
        assert total() == 6
        log.take()
        with rt.batch():
            a.set(10)
            b.set(20)
            c.set(30)
            assert rt.revision == 1
        assert rt.revision == 1
        assert total() == 60
        assert log.take() == ["total"]
        a.set(11)
        assert rt.revision == 2


def test_batch_recomputes_once_through_stabilize(rt, log):
    a, b, c, total = make_sum(rt, log)
    seen = []
    o = rt.observe(total)
    o.on_change(seen.append)
    log.take()
    with rt.batch():
        a.set(4)
        b.set(5)
    report = rt.stabilize()
    assert log.take() == ["total"]
    assert report.recomputed == [label(total)]
    assert report.revision == 1
    assert seen == [12]


def test_batch_with_no_effective_set_makes_no_revision(rt, log):
    a, b, c, total = make_sum(rt, log)
    with rt:
        total()
        log.take()
        with rt.batch():
            a.set(1)
            b.set(2)
        assert rt.revision == 0
        assert total() == 6
        assert log.take() == []


def test_empty_batches_and_nested_batches(rt):
    a = rt.input("a", 1)
    b = rt.input("b", 2)
    with rt.batch():
        pass
    assert rt.revision == 0
    with rt.batch():
        a.set(5)
        with rt.batch():
            b.set(6)
        a.set(7)
    assert rt.revision == 1
    with rt.batch():
        a.set(8)
    with rt.batch():
        b.set(9)
    assert rt.revision == 3


def test_set_changed_back_within_a_batch(rt, log):
    a, b, c, total = make_sum(rt, log)
    with rt:
        total()
        log.take()
        with rt.batch():
            a.set(100)
            a.set(1)
        # the revision moved (sets were effective) but the value is the same: the cell may
        # re-run, and it must give the same answer
        assert total() == 6
        assert log.take() in ([], ["total"])


def test_exception_inside_a_batch_keeps_earlier_sets_as_one_revision(rt, log):
    a, b, c, total = make_sum(rt, log)
    with rt:
        total()
        log.take()
        with pytest.raises(RuntimeError, match="midway"):
            with rt.batch():
                a.set(10)
                b.set(20)
                raise RuntimeError("midway")
        assert rt.revision == 1
        assert (a.get(), b.get(), c.get()) == (10, 20, 3)
        assert total() == 33
        assert log.take() == ["total"]
        # the batch is over: the next set is a revision of its own
        c.set(4)
        assert rt.revision == 2
        b.set(21)
        assert rt.revision == 3
        assert total() == 35
        assert log.take() == ["total"]


def test_demand_inside_a_batch_sees_the_sets_made_so_far(rt, log):
    # the revision does not move between sets of one batch, yet a later set must still make
    # what was computed earlier in the batch stale
    a, b, c, total = make_sum(rt, log)
    with rt:
        total()
        log.take()
        with rt.batch():
            a.set(10)
            assert total() == 15
            b.set(20)
            assert total() == 33
            assert rt.revision == 1
        assert total() == 33
        assert log.take() == ["total", "total"]
