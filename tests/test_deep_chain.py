"""Depth: propagation never recurses in proportion to the depth of the graph. A chain of a million
cells, once built, propagates a change from its head with Python's default recursion limit; a
first-time demand deeper than that limit fails cleanly (or succeeds) and leaves the runtime usable.
"""

from __future__ import annotations

import sys

import pytest

import incr

N = 10**6


def make_chain(rt, ran):
    head = rt.input("head", 0)

    @incr.cell
    def link(i):  # one cell, a million instances: link(i) reads link(i - 1)
        ran.append(i)
        return (head.get() if i == 0 else link(i - 1)) + 1

    return head, link


@pytest.mark.slow
def test_million_cell_chain_propagates_without_recursion():
    limit = sys.getrecursionlimit()
    assert limit <= 10_000  # the interpreter's default, not one raised for this test
    rt = incr.Runtime()
    ran = []
    head, link = make_chain(rt, ran)

    # build: demanding link(0), link(1), ... in order nests one level per first demand
    with rt:
        for i in range(N):
            link(i)
    assert ran == list(range(N))
    assert sys.getrecursionlimit() == limit
    ran.clear()

    # a change at the head, demanded at the tail
    head.set(1)
    with rt:
        assert link(N - 1) == N + 1
    assert len(ran) == N
    assert ran == list(range(N))  # each exactly once, head to tail
    ran.clear()
    with rt:
        assert link(N - 1) == N + 1
        assert link(N // 2) == N // 2 + 2
    assert ran == []

    # the same through an observer and stabilize()
    o = rt.observe(link, N - 1)
    seen = []
    o.on_change(seen.append)
    assert ran == []
    head.set(2)
    report = rt.stabilize()
    assert len(ran) == N
    assert ran == list(range(N))
    assert len(report.recomputed) == N
    assert report.recomputed[0] == "link(0)" and report.recomputed[-1] == f"link({N - 1})"
    assert seen == [N + 2]
    assert o.value == N + 2
    ran.clear()

    # a change undone within one batch: at most link(0) runs (to an equal value); the rest of
    # the chain is verified without running, and no callback fires
    with rt.batch():
        head.set(3)
        head.set(2)
    report = rt.stabilize()
    assert ran in ([], [0])
    if ran:
        assert report.cutoff == ["link(0)"]
        assert report.reused == N - 1
    assert seen == [N + 2]

    assert sys.getrecursionlimit() == limit
    rt._check()


def test_first_demand_deeper_than_the_recursion_limit(rt, log):
    limit = sys.getrecursionlimit()
    depth = limit * 3
    x = rt.input("x", 0)

    @incr.cell
    def deep(i):
        log(i)
        return (x.get() if i == 0 else deep(i - 1)) + 1

    with rt:
        try:
            value = deep(depth)
        except RecursionError as e:
            notes = getattr(e, "__notes__", [])
            assert any("incr: raised in cell" in n for n in notes), notes
            rt._check()
            # usable: the same chain built in steps shallower than the limit
            for i in range(0, depth + 1, limit // 4):
                deep(i)
            value = deep(depth)
        assert value == depth + 1
        rt._check()
        log.take()
        # once built, it propagates without recursion
        x.set(10)
        assert deep(depth) == depth + 11
        assert log.take() == list(range(depth + 1))
    assert sys.getrecursionlimit() == limit
