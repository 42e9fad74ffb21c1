"""Deep graphs whose shape defeats a plain pull: the changed dependency is read *before* the
deep one, so a naive verifier would re-run each cell from inside the previous one's run and
recurse once per level. incr must propagate with Python's default recursion limit, running
each cell exactly once."""

import sys
from collections import Counter

import pytest

import incr


def build_ladder(rt, n, ran):
    x = rt.input("x", 1)
    cells = []

    def make(i):
        if i == 0:
            def body():
                ran[i] += 1
                return x.get()
        else:
            prev = cells[i - 1]

            def body():
                ran[i] += 1
                return (x.get() + prev()) % 1_000_003   # x first: it is the changed dependency
        body.__qualname__ = f"rung{i}"
        return incr.cell(body)

    for i in range(n):
        cells.append(make(i))
    with rt:
        for c in cells:   # first demands in order: each nests one level only
            c()
    return x, cells


def expected(n, xv):
    v = xv
    for _ in range(1, n):
        v = (xv + v) % 1_000_003
    return v


@pytest.mark.parametrize("n", [3_000, 100_000])
def test_ladder_propagates_without_recursion(n):
    assert sys.getrecursionlimit() <= 10_000
    rt = incr.Runtime()
    ran = Counter()
    x, cells = build_ladder(rt, n, ran)
    ran.clear()
    with rt:
        x.set(2)
        assert cells[-1]() == expected(n, 2)
    assert len(ran) == n and set(ran.values()) == {1}, "every rung runs exactly once"
    if n <= 3_000:
        rt._check()


def test_ladder_under_stabilize():
    n = 20_000
    rt = incr.Runtime()
    ran = Counter()
    x, cells = build_ladder(rt, n, ran)
    with rt:
        obs = rt.observe(cells[-1])
        ran.clear()
        x.set(3)
        report = rt.stabilize()
    assert obs.value == expected(n, 3)
    assert len(report.recomputed) == n
    assert set(ran.values()) == {1} and len(ran) == n


def test_shallow_branch_not_taken_is_never_run():
    # Salsa's order holds for shallow graphs: once `flag` changed, the re-run decides what it
    # reads; the stale branch it no longer takes is not brought up to date first.
    rt = incr.Runtime()
    flag = rt.input("flag", True)
    y = rt.input("y", 1)
    ran = []

    @incr.cell
    def risky():
        ran.append("risky")
        return 10 // y.get()

    @incr.cell
    def top():
        ran.append("top")
        return risky() if flag.get() else -1

    with rt:
        assert top() == 10
        with rt.batch():
            flag.set(False)
            y.set(0)           # risky() would now raise
        ran.clear()
        assert top() == -1
    assert ran == ["top"]
    rt._check()
