"""Two runtimes share cells (functions) but nothing else: each keeps its own memo, its own runs
and its own inputs."""

from __future__ import annotations

import pytest

import incr


@pytest.fixture
def rt2():
    other = incr.Runtime()
    yield other
    other._check()


def test_same_cell_keeps_separate_memos_and_runs(rt, rt2, log):
    inputs = {rt: rt.input("x", 1), rt2: rt2.input("x", 100)}

    @incr.cell
    def doubled():
        log(("doubled", incr.current()))
        return inputs[incr.current()].get() * 2

    with rt:
        assert doubled() == 2
    with rt2:
        assert doubled() == 200
    assert log.take() == [("doubled", rt), ("doubled", rt2)]
    # alternate: each runtime serves its own memo
    for _ in range(2):
        with rt:
            assert doubled() == 2
        with rt2:
            assert doubled() == 200
    assert log.take() == []
    inputs[rt].set(5)
    assert (rt.revision, rt2.revision) == (1, 0)
    with rt2:
        assert doubled() == 200
    assert log.take() == []
    with rt:
        assert doubled() == 10
    assert log.take() == [("doubled", rt)]
    with rt2:
        with rt:
            assert doubled() == 10
        assert doubled() == 200
    assert log.take() == []


def test_input_arguments_with_the_same_name_on_two_runtimes(rt, rt2, log):
    a1 = rt.input("a", 1)
    a2 = rt2.input("a", 2)

    @incr.cell
    def read(inp):
        log(inp.get())
        return inp.get() + 10

    with rt:
        assert read(a1) == 11
    with rt2:
        assert read(a2) == 12
    assert log.take() == [1, 2]
    a2.set(3)
    with rt:
        assert read(a1) == 11
    with rt2:
        assert read(a2) == 13
    assert log.take() == [3]


def test_observers_and_stabilize_are_per_runtime(rt, rt2, log):
    inputs = {rt: rt.input("x", 1), rt2: rt2.input("x", 10)}

    @incr.cell
    def sq():
        log(("sq", incr.current()))
        return inputs[incr.current()].get() ** 2

    o1 = rt.observe(sq)
    o2 = rt2.observe(sq)
    assert (o1.value, o2.value) == (1, 100)
    log.take()
    inputs[rt].set(2)
    assert rt2.stabilize().recomputed == []
    assert log.take() == []
    assert rt.stabilize().recomputed != []
    assert log.take() == [("sq", rt)]
    assert (o1.value, o2.value) == (4, 100)


def test_reading_another_runtimes_input_inside_a_cell_raises(rt, rt2, log):
    foreign = rt.input("foreign", 1)
    rt2.input("local", 2)

    @incr.cell
    def trespass():
        log("trespass")
        return foreign.get()

    with rt2:
        with pytest.raises(incr.IncrError) as info:
            trespass()
    assert "foreign" in str(info.value)
    assert log.take() == ["trespass"]
    # the same cell on its own runtime is fine, and rt2 stays usable
    with rt:
        assert trespass() == 1
    with rt2:
        with pytest.raises(incr.IncrError):
            trespass()  # not memoized as a success on rt2
    assert log.take() == ["trespass", "trespass"]


def test_reading_another_runtimes_input_when_observing_raises(rt, rt2):
    foreign = rt.input("foreign", 1)

    @incr.cell
    def trespass():
        return foreign.get()

    # the instance is observed all the same; its error is kept and raised by .value
    o = rt2.observe(trespass)
    with pytest.raises(incr.IncrError):
        o.value                      # reading it stabilizes: the run raises
    assert isinstance(o.error, incr.IncrError)
    with pytest.raises(incr.IncrError):
        rt2.stabilize()
    rt2._check()


def test_setting_another_runtimes_input_inside_a_running_cell_raises(rt, rt2, log):
    # API.md: "Input.set (or any other change) from inside a running cell raises
    # ReentrancyError" -- a cell of rt2 is running, so changing rt's input is refused too
    foreign = rt.input("foreign", 1)

    @incr.cell
    def meddler():
        log("meddler")
        foreign.set(2)
        return 0

    with rt2:
        with pytest.raises(incr.IncrError):
            meddler()
    assert log.take() == ["meddler"]
    assert foreign.get() == 1
    assert rt.revision == 0


def test_input_get_outside_cells_works_from_any_runtime(rt, rt2):
    x = rt.input("x", 7)
    with rt2:
        assert x.get() == 7
    assert x.get() == 7


def test_closing_one_runtime_leaves_the_other_usable(rt, rt2, log):
    inputs = {rt: rt.input("x", 1), rt2: rt2.input("x", 2)}

    @incr.cell
    def val():
        log("val")
        return inputs[incr.current()].get()

    with rt:
        val()
    with rt2:
        val()
    rt.close()
    with rt2:
        assert val() == 2
        inputs[rt2].set(3)
        assert val() == 3
    assert log.take() == ["val", "val", "val"]
