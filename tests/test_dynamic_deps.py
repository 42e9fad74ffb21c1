"""Dynamic dependencies: a cell depends on what it read on its LAST run, recorded again on every
run, so a branch it no longer takes can neither wake it up nor be run for it."""

from __future__ import annotations

import incr


def make_switch(rt, log):
    cond = rt.input("cond", True)
    a_in = rt.input("a_in", 1)
    b_in = rt.input("b_in", 2)

    @incr.cell
    def a():
        log("a")
        return a_in.get() * 10

    @incr.cell
    def b():
        log("b")
        return 100 // b_in.get()  # raises ZeroDivisionError when b_in is 0

    @incr.cell
    def pick():
        log("pick")
        return a() if cond.get() else b()

    return cond, a_in, b_in, a, b, pick


def test_untaken_branch_changes_run_nothing(rt, log):
    cond, a_in, b_in, a, b, pick = make_switch(rt, log)
    with rt:
        assert pick() == 10
        assert log.take() == ["pick", "a"]
        b_in.set(5)  # b was never read
        assert pick() == 10
        assert log.take() == []
        cond.set(False)
        assert pick() == 20
        assert log.take() == ["pick", "b"]
        a_in.set(7)  # a is no longer read by pick
        assert pick() == 20
        assert log.take() == []
        b_in.set(4)
        assert pick() == 25
        assert log.take() == ["b", "pick"]


def test_deps_are_recorded_again_on_every_run(rt, log):
    cond, a_in, b_in, a, b, pick = make_switch(rt, log)
    with rt:
        pick()
        cond.set(False)
        pick()
        cond.set(True)
        assert pick() == 10
        log.take()
        b_in.set(50)  # the last run read cond and a only
        assert pick() == 10
        assert log.take() == []
        a_in.set(3)
        assert pick() == 30
        assert log.take() == ["a", "pick"]


def test_a_no_longer_taken_branch_that_would_raise_is_never_run(rt, log):
    cond, a_in, b_in, a, b, pick = make_switch(rt, log)
    with rt:
        cond.set(False)
        assert pick() == 50
        log.take()
        with rt.batch():
            cond.set(True)
            b_in.set(0)  # b() would now raise
        assert pick() == 10
        assert log.take() == ["pick", "a"]
        # b itself still raises when demanded directly
        try:
            b()
        except ZeroDivisionError:
            pass
        else:
            raise AssertionError("b() should raise with b_in == 0")
        assert log.take() == ["b"]


def test_no_longer_taken_branch_is_not_run_by_stabilize(rt, log):
    cond, a_in, b_in, a, b, pick = make_switch(rt, log)
    cond.set(False)
    o = rt.observe(pick)
    assert o.value == 50
    log.take()
    with rt.batch():
        cond.set(True)
        b_in.set(0)
    report = rt.stabilize()
    assert log.take() == ["pick", "a"]
    assert "b()" not in " ".join(report.recomputed)
    assert o.value == 10


def test_read_order_decides_what_is_verified(rt, log):
    # deps are walked in read order: once cond is found changed the cell re-runs, and the old
    # branch (read after cond) is not brought up to date on its behalf
    cond = rt.input("cond", False)
    src = rt.input("src", 1)

    @incr.cell
    def expensive():
        log("expensive")
        return src.get() * 2

    @incr.cell
    def chooser():
        log("chooser")
        return "constant" if cond.get() else expensive()

    with rt:
        assert chooser() == 2
        log.take()
        with rt.batch():
            src.set(2)
            cond.set(True)
        assert chooser() == "constant"
        assert log.take() == ["chooser"]


def test_dependency_on_a_cell_disappears_and_comes_back(rt, log):
    n = rt.input("n", 2)
    item = rt.input("item", 0)

    @incr.cell
    def element(i):
        log(f"element({i})")
        return i * 100 + item.get()

    @incr.cell
    def listing():
        log("listing")
        return [element(i) for i in range(n.get())]

    with rt:
        assert listing() == [0, 100]
        log.take()
        n.set(1)
        assert listing() == [0]
        assert log.take() == ["listing"]
        item.set(1)
        assert listing() == [1]
        assert log.take() == ["element(0)", "listing"]
        n.set(2)
        # element(1) read item when it was 0: it must not serve that stale value
        assert listing() == [1, 101]
        assert log.counts() == {"listing": 1, "element(1)": 1}
