"""Inputs, the first computation, revisions, the active runtime and close()."""

from __future__ import annotations

import uuid

import pytest

import incr


def test_input_get_and_name(rt):
    price = rt.input("price", 10.0)
    assert price.name == "price"
    assert price.get() == 10.0
    price.set(12.5)
    assert price.get() == 12.5


def test_first_computation_runs_each_cell_once_then_memoizes(rt, log):
    price = rt.input("price", 10.0)
    qty = rt.input("qty", 3)

    @incr.cell
    def subtotal():
        log("subtotal")
        return price.get() * qty.get()

    @incr.cell
    def total(tax):
        log(f"total({tax})")
        return round(subtotal() * (1 + tax), 2)

    with rt:
        assert total(0.2) == 36.0
        assert log.take() == ["total(0.2)", "subtotal"]  # logged as each body starts
        assert total(0.2) == 36.0
        assert subtotal() == 30.0
        assert log.take() == []
        # another argument is another instance; subtotal() is shared
        assert total(0.5) == 45.0
        assert log.take() == ["total(0.5)"]


def test_set_reruns_only_what_depends_on_the_change(rt, log):
    price = rt.input("price", 10.0)
    qty = rt.input("qty", 3)
    other = rt.input("other", "x")

    @incr.cell
    def subtotal():
        log("subtotal")
        return price.get() * qty.get()

    @incr.cell
    def total(tax):
        log("total")
        return round(subtotal() * (1 + tax), 2)

    @incr.cell
    def shout():
        log("shout")
        return other.get().upper()

    with rt:
        total(0.2), shout()
        log.take()
        qty.set(4)
        assert total(0.2) == 48.0
        assert shout() == "X"
        assert log.take() == ["subtotal", "total"]
        other.set("y")
        assert total(0.2) == 48.0
        assert log.take() == []
        assert shout() == "Y"
        assert log.take() == ["shout"]


def test_setting_an_equal_value_is_a_noop(rt, log):
    qty = rt.input("qty", 3)
    name = rt.input("name", ("a", 1))

    @incr.cell
    def double():
        log("double")
        return qty.get() * 2, name.get()

    with rt:
        double()
        log.take()
        qty.set(3)
        name.set(("a", 1))  # equal, not identical
        assert rt.revision == 0
        assert double() == (6, ("a", 1))
        assert log.take() == []
        assert "first time" in rt.explain(double)


def test_revision_counts_effective_sets(rt):
    a = rt.input("a", 1)
    b = rt.input("b", "s")
    assert rt.revision == 0
    a.set(2)
    assert rt.revision == 1
    a.set(2)
    assert rt.revision == 1
    b.set("t")
    assert rt.revision == 2
    a.set(2.0)  # same ==, other type: a change
    assert rt.revision == 3
    a.set(True)
    assert rt.revision == 4
    assert a.get() is True


def test_a_value_of_another_type_is_a_change_for_inputs(rt, log):
    x = rt.input("x", 1)

    @incr.cell
    def kind():
        log("kind")
        return type(x.get()).__name__

    with rt:
        assert kind() == "int"
        log.take()
        x.set(1.0)
        assert kind() == "float"
        assert log.take() == ["kind"]


def test_with_rt_makes_it_current_and_restores(rt):
    outer = incr.current()
    assert outer is not rt
    with rt as entered:
        assert entered is rt
        assert incr.current() is rt
        other = incr.Runtime()
        with other:
            assert incr.current() is other
        assert incr.current() is rt
    assert incr.current() is outer
    other._check()


def test_cells_run_on_the_runtime_of_the_innermost_with(rt, log):
    other = incr.Runtime()

    @incr.cell
    def where():
        log("where")
        return id(incr.current())

    with rt:
        assert where() == id(rt)
        with other:
            assert where() == id(other)
        assert where() == id(rt)
    assert log.take() == ["where", "where"]
    other._check()


def test_default_process_wide_runtime_outside_with(log):
    default = incr.current()
    assert isinstance(default, incr.Runtime)
    assert incr.current() is default
    name = f"basics-{uuid.uuid4().hex}"
    x = default.input(name, 5)

    @incr.cell
    def triple():
        log("triple")
        return x.get() * 3

    assert triple() == 15
    assert triple() == 15
    assert log.take() == ["triple"]
    rev = default.revision
    x.set(6)
    assert default.revision == rev + 1
    assert triple() == 18
    assert log.take() == ["triple"]
    # the default runtime is where the memo lives: a fresh runtime computes it again
    fresh = incr.Runtime()
    with fresh:
        with pytest.raises(incr.IncrError):
            triple()  # x belongs to the default runtime, not to `fresh`
    default._check()
    fresh._check()


def test_close_makes_the_runtime_unusable(log):
    rt = incr.Runtime()
    x = rt.input("x", 1)

    @incr.cell
    def f():
        log("f")
        return x.get()

    @incr.cell
    def g():
        return 0

    with rt:
        assert f() == 1
        o = rt.observe(f)
        rt.close()
        assert rt.closed
        with pytest.raises(incr.IncrError):
            f()  # memoized, still refused
        with pytest.raises(incr.IncrError):
            g()  # never computed
    with pytest.raises(incr.IncrError):
        x.set(2)
    assert rt.revision == 0
    with pytest.raises(incr.IncrError):
        rt.stabilize()
    with pytest.raises(incr.IncrError):
        rt.input("y", 1)
    with pytest.raises(incr.IncrError):
        rt.observe(f)
    with pytest.raises(incr.IncrError):
        o.value
    with pytest.raises(incr.IncrError):
        with rt:
            pass
    with pytest.raises(incr.IncrError):
        with rt.batch():
            pass
    rt.close()  # idempotent
    assert log.take() == ["f"]
    rt._check()


def test_instances_lists_what_was_computed(rt):
    x = rt.input("x", 1)

    @incr.cell
    def f(k):
        return x.get() + k

    with rt:
        f(1), f(2), f(1)
    assert len(rt._instances()) == 2
