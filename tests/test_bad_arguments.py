"""Bad arguments speak to the user: a TypeError or ValueError whose message names the cell and
the argument, and nothing runs."""

from __future__ import annotations

import pytest

import incr
from conftest import name


def make_cell(log):
    @incr.cell
    def lookup(widget, scale=1):
        log("lookup")
        return scale

    return lookup


@pytest.mark.parametrize(
    "bad, where",
    [
        (object(), "widget"),
        ({1, 2}, "widget"),  # a set, not a frozenset
        ({1: "a"}, "widget"),  # dict keys must be str
        ([1, object()], "widget"),
        ({"k": {3.5}}, "widget"),
        ((1, (2, bytearray(b"x"))), "widget"),
    ],
    ids=["object", "set", "dict-int-keys", "nested-in-list", "nested-in-dict", "nested-tuple"],
)
def test_unencodable_argument_names_cell_and_argument(rt, log, bad, where):
    lookup = make_cell(log)
    with rt:
        with pytest.raises(TypeError) as info:
            lookup(bad)
        msg = str(info.value)
        assert name(lookup) in msg
        assert where in msg
        assert log.take() == []
        assert lookup(1) == 1  # the runtime is fine
    assert len(rt._instances()) == 1


def test_unencodable_keyword_argument_names_it(rt, log):
    lookup = make_cell(log)
    with rt:
        with pytest.raises(TypeError) as info:
            lookup(1, scale=object())
    assert name(lookup) in str(info.value)
    assert "scale" in str(info.value)
    assert log.take() == []


def test_unencodable_argument_from_inside_a_cell(rt, log):
    lookup = make_cell(log)

    @incr.cell
    def caller():
        log("caller")
        return lookup({1, 2})

    with rt:
        with pytest.raises(TypeError) as info:
            caller()
        assert name(lookup) in str(info.value)
        assert log.take() == ["caller"]
        assert lookup(2) == 1


def test_unregistered_user_class_is_refused(rt, log):
    class Opaque:
        pass

    lookup = make_cell(log)
    with rt:
        with pytest.raises(TypeError) as info:
            lookup(Opaque())
    assert "widget" in str(info.value)
    assert "register_type" in str(info.value)  # says what to do next


@pytest.mark.parametrize(
    "args, kwargs",
    [((), {}), ((1, 2, 3), {}), ((1,), {"nope": 2}), ((1,), {"widget": 1})],
    ids=["missing", "too-many", "unknown-keyword", "twice"],
)
def test_wrong_arity_names_the_cell(rt, log, args, kwargs):
    lookup = make_cell(log)
    with rt:
        with pytest.raises(TypeError) as info:
            lookup(*args, **kwargs)
    assert name(lookup) in str(info.value)
    assert log.take() == []


def test_wrong_arity_on_a_cell_without_defaults(rt, log):
    @incr.cell
    def pair(a, b):
        log("pair")
        return (a, b)

    with rt:
        with pytest.raises(TypeError) as info:
            pair(1)
        assert name(pair) in str(info.value)
        with pytest.raises(TypeError) as info:
            pair(1, 2, 3)
        assert name(pair) in str(info.value)
        assert pair(1, 2) == (1, 2)
    assert log.take() == ["pair"]


def test_bad_cutoff_is_a_type_error():
    def pricey():
        return 1

    for bad in ("EQUAL", 1, None, [incr.EQUAL]):
        with pytest.raises(TypeError) as info:
            incr.cell(cutoff=bad)(pricey)
        assert "cutoff" in str(info.value)
        assert "pricey" in str(info.value)


def test_a_cell_needs_a_callable():
    with pytest.raises(TypeError):
        incr.cell(42)


def test_duplicate_input_name(rt):
    rt.input("price", 1)
    with pytest.raises(ValueError) as info:
        rt.input("price", 2)
    assert "price" in str(info.value)
    other = incr.Runtime()
    other.input("price", 3)  # names are unique within one runtime only
    other._check()


def test_explain_and_observe_check_arguments_too(rt):
    @incr.cell
    def f(x):
        return x

    with pytest.raises(TypeError) as info:
        rt.observe(f, object())
    assert name(f) in str(info.value)
    with pytest.raises(TypeError) as info:
        rt.explain(f, {1, 2})
    assert name(f) in str(info.value)
    assert rt._instances() == []
