"""Diamonds: a change reaches the bottom through two paths, yet each instance runs once, after
its dependencies, and never sees a mix of old and new values (no glitch)."""

from __future__ import annotations

import incr
from conftest import label


def make_diamond(rt, log, seen):
    x = rt.input("x", 1)

    @incr.cell
    def left():
        v = x.get() + 1
        log("left")
        return v

    @incr.cell
    def right():
        v = x.get() * 10
        log("right")
        return v

    @incr.cell
    def bottom():
        lv, rv = left(), right()
        seen.append((lv, rv))
        log("bottom")
        return lv + rv

    return x, left, right, bottom


def consistent(pair):
    lv, rv = pair
    return rv == (lv - 1) * 10


def test_diamond_recomputes_each_once_in_dependency_order(rt, log):
    seen = []
    x, left, right, bottom = make_diamond(rt, log, seen)
    with rt:
        assert bottom() == 12
        assert log.take() == ["left", "right", "bottom"]
        x.set(2)
        assert bottom() == 23
        assert log.counts() == {"left": 1, "right": 1, "bottom": 1}
        assert bottom() == 23
        assert log.take() == []
    assert all(consistent(p) for p in seen), seen


def test_diamond_through_stabilize_has_no_glitch(rt, log):
    seen = []
    x, left, right, bottom = make_diamond(rt, log, seen)
    o = rt.observe(bottom)
    log.take()
    x.set(5)
    report = rt.stabilize()
    ran = log.take()
    assert sorted(ran) == ["bottom", "left", "right"]
    assert ran[-1] == "bottom"
    assert report.recomputed[-1] == label(bottom)
    assert sorted(report.recomputed) == sorted([label(left), label(right), label(bottom)])
    assert o.value == 56
    assert seen[-1] == (6, 50)
    assert all(consistent(p) for p in seen), seen


def test_wide_and_deep_diamond_runs_every_instance_once(rt, log):
    # x -> level(1, i) for i < 4 -> level(2, i) reads all of level 1 -> ... -> top reads level 4
    x = rt.input("x", 1)
    width, depth = 4, 4

    @incr.cell
    def level(d, i):
        if d == 0:
            v = x.get()
        else:
            parts = [level(d - 1, j) for j in range(width)]
            assert len(set(parts)) == 1, f"glitch at level({d}, {i}): {parts}"
            v = parts[0] + 1
        log((d, i))
        return v

    @incr.cell
    def top():
        parts = [level(depth, j) for j in range(width)]
        assert len(set(parts)) == 1, f"glitch at top: {parts}"
        log("top")
        return parts[0]

    with rt:
        assert top() == 1 + depth
        first = log.counts()
        assert set(first.values()) == {1}
        assert len(first) == width * (depth + 1) + 1
        for n in (7, 8, 100):
            x.set(n)
            assert top() == n + depth
            again = log.take()
            assert sorted(again, key=str) == sorted(first, key=str)  # each exactly once
            # dependency order: every level finished before any instance of the next one
            levels = [e[0] for e in again if e != "top"]
            assert levels == sorted(levels)
            assert again[-1] == "top"


def test_diamond_where_one_side_is_cut_off(rt, log):
    x = rt.input("x", 2)

    @incr.cell
    def parity():
        log("parity")
        return x.get() % 2

    @incr.cell
    def half():
        log("half")
        return x.get() // 2

    @incr.cell
    def bottom():
        log("bottom")
        return (parity(), half())

    with rt:
        assert bottom() == (0, 1)
        log.take()
        x.set(4)  # parity unchanged, half changed
        assert bottom() == (0, 2)
        assert log.counts() == {"parity": 1, "half": 1, "bottom": 1}
        x.set(5)  # both changed
        assert bottom() == (1, 2)
        assert log.counts() == {"parity": 1, "half": 1, "bottom": 1}
