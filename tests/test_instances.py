"""Each distinct set of arguments is its own instance: same value of the same type, all the way
down, means same instance; keyword, positional and defaulted spellings of one call are one."""

from __future__ import annotations

import math

import pytest

import incr
from conftest import label, name


def make_echo(log):
    @incr.cell
    def echo(v):
        log(repr(v))
        return (type(v).__name__, v)

    return echo


def test_per_argument_instances(rt, log):
    x = rt.input("x", 1)

    @incr.cell
    def scaled(k):
        log(k)
        return x.get() * k

    with rt:
        assert [scaled(k) for k in (1, 2, 3, 2, 1)] == [1, 2, 3, 2, 1]
        assert log.take() == [1, 2, 3]
        x.set(10)
        assert scaled(2) == 20
        assert log.take() == [2]
        assert scaled(3) == 30
        assert log.take() == [3]


def test_one_float_and_true_are_three_instances(rt, log):
    echo = make_echo(log)
    with rt:
        assert echo(1) == ("int", 1)
        assert echo(1.0) == ("float", 1.0)
        assert echo(True) == ("bool", True)
        assert log.take() == ["1", "1.0", "True"]
        echo(1), echo(1.0), echo(True)
        assert log.take() == []
    assert len(rt._instances()) == 3
    for v, r in ((1, "1"), (1.0, "1.0"), (True, "True")):
        assert label(echo, v) == f"{name(echo)}({r})"
        assert rt.explain(echo, v).startswith(f"{label(echo, v)} was computed")


def test_tuple_and_list_are_two_instances(rt, log):
    echo = make_echo(log)
    with rt:
        assert echo((1,)) == ("tuple", (1,))
        assert echo([1]) == ("list", [1])
        assert echo((1,)) == ("tuple", (1,))
        assert echo([1]) == ("list", [1])
        assert log.take() == ["(1,)", "[1]"]
        # the type is part of the key all the way down
        echo(((1,),)), echo(([1],)), echo(((1.0,),))
        assert len(log.take()) == 3


def test_equal_containers_are_the_same_instance(rt, log):
    echo = make_echo(log)
    with rt:
        echo([1, "a", (2.5, None)])
        echo([1, "a", (2.5, None)])
        echo(frozenset({1, 2}))
        echo(frozenset({2, 1}))
        echo(b"raw")
        echo(b"raw")
        assert len(log.take()) == 3


def test_dict_arguments(rt, log):
    echo = make_echo(log)
    with rt:
        echo({"a": 1, "b": [2]})
        echo({"b": [2], "a": 1})  # insertion order does not matter
        assert len(log.take()) == 1
        echo({"a": 1.0, "b": [2]})
        echo({"a": 1, "b": (2,)})
        echo({"a": 1})
        assert len(log.take()) == 3


def test_zero_signs_and_nan(rt, log):
    echo = make_echo(log)
    with rt:
        echo(0.0), echo(-0.0)
        assert log.take() == ["0.0", "-0.0"]
        first = echo(float("nan"))
        second = echo(float("nan"))
        assert log.take() == ["nan"]
        assert math.isnan(first[1]) and second is first


def test_positional_keyword_and_default_spellings_are_one_instance(rt, log):
    @incr.cell
    def f(x, y=7):
        log((x, y))
        return x + y

    with rt:
        assert f(1) == 8
        assert f(1, 7) == 8
        assert f(1, y=7) == 8
        assert f(x=1) == 8
        assert f(y=7, x=1) == 8
        assert log.take() == [(1, 7)]
        assert f(1, 8) == 9
        assert f(x=1, y=8) == 9
        assert log.take() == [(1, 8)]
    assert len(rt._instances()) == 2
    assert "first time" in rt.explain(f, x=1, y=7)


def test_keyword_only_and_varargs_cells(rt, log):
    @incr.cell
    def g(a, *rest, scale=1, **opts):
        log((a, rest, scale, tuple(sorted(opts.items()))))
        return (a + sum(rest)) * scale

    with rt:
        assert g(1, 2, 3) == 6
        assert g(1, 2, 3, scale=1) == 6
        assert g(1, 2, 3, scale=2) == 12
        assert g(1, 2, 3, scale=2, tag="t") == 12
        assert g(1, 2, 3, tag="t", scale=2) == 12
        assert log.take() == [
            (1, (2, 3), 1, ()),
            (1, (2, 3), 2, ()),
            (1, (2, 3), 2, (("tag", "t"),)),
        ]


def test_inputs_as_arguments(rt, log):
    a = rt.input("a", 1)
    b = rt.input("b", 2)

    @incr.cell
    def read(inp):
        log(inp.name)
        return inp.get() * 10

    with rt:
        assert read(a) == 10
        assert read(b) == 20
        assert read(a) == 10
        assert log.take() == ["a", "b"]
        a.set(5)
        assert read(a) == 50
        assert read(b) == 20
        assert log.take() == ["a"]
    assert rt.explain(read, a).startswith(f"{name(read)}({a!r}) was recomputed")


class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y


incr.register_type(Point, lambda p: (p.x, p.y), lambda t: Point(*t))


def test_registered_type_as_argument(rt, log):
    @incr.cell
    def norm1(p):
        log((p.x, p.y))
        return abs(p.x) + abs(p.y)

    with rt:
        assert norm1(Point(1, -2)) == 3
        assert norm1(Point(1, -2)) == 3  # another object, same encoding: same instance
        assert norm1(Point(2, 2)) == 4
        assert norm1(Point(1.0, -2)) == 3.0  # encodes differently: another instance
        assert log.take() == [(1, -2), (2, 2), (1.0, -2)]
        assert norm1([Point(1, -2)][0]) == 3
        assert log.take() == []


def test_register_type_rejects_bad_codecs():
    class Thing:
        pass

    with pytest.raises(TypeError):
        incr.register_type(Thing, "not callable", lambda v: v)
    with pytest.raises(TypeError):
        incr.register_type("Thing", lambda v: v, lambda v: v)
