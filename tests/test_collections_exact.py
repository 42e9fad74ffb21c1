"""Input maps and map nodes tell values apart by the core's one rule, keep their own copy of
mutable values, defer changes from other threads, and apply an update all or nothing (the
fixes of attack4's collection findings, tests/test_attack_v4.py). Each test asserts what was
recomputed: counters in the per-key functions."""

from __future__ import annotations

import threading

import pytest

import incr


def _counted(log):
    def f(k, v):
        log.append(k)
        return repr(v)
    return f


@pytest.mark.parametrize("before,after", [(0.0, -0.0), ([1], [True]), ({"a": 1}, {"a": 1.0}),
                                          ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
                                          (frozenset({1}), frozenset({True}))])
def test_an_equal_but_different_value_reruns_that_key_only(before, after):
    rt = incr.Runtime()
    m = incr.input_map(rt, "m", {"k": before, "j": before, "z": 0})
    runs = []
    r = m.map(_counted(runs))
    with rt:
        r()
    assert sorted(runs) == ["j", "k", "z"]
    runs.clear()
    rev = rt.revision
    m.set("k", before)                       # the same value: nothing
    m.update({"j": before})
    assert rt.revision == rev
    m.set("k", after)
    with rt:
        assert r()["k"] == repr(after)
    assert runs == ["k"]
    runs.clear()
    m.update({"j": after, "z": 0})
    with rt:
        assert r()["j"] == repr(after)
    assert runs == ["j"]


def test_a_per_key_result_that_changes_to_minus_zero_reaches_the_next_map_only_for_that_key():
    rt = incr.Runtime()
    m = incr.input_map(rt, "m", {"a": 1.0, "b": 2.0})
    signs = []

    def sign(k, v):
        signs.append(k)
        return repr(v)

    out = m.map(lambda k, v: v * 0.0).map(sign)
    with rt:
        out()
    signs.clear()
    m.set("a", -1.0)                        # a's product: 0.0 -> -0.0
    with rt:
        assert dict(out()) == {"a": "-0.0", "b": "0.0"}
    assert signs == ["a"]
    signs.clear()
    m.set("b", 3.0)                         # b's product stays 0.0: cut off
    with rt:
        out()
    assert signs == []


def test_mutate_then_set_again_is_a_change_for_input_and_input_map():
    rt = incr.Runtime()
    x = rt.input("x", [1, 2])
    runs = []

    @incr.cell
    def total():
        runs.append(1)
        return sum(x.get())

    with rt:
        assert total() == 3
    x.get().append(3)
    x.set(x.get())
    with rt:
        assert total() == 6
    assert len(runs) == 2
    x.set([1, 2, 3])                         # equal to its own copy: nothing
    with rt:
        total()
    assert len(runs) == 2

    m = incr.input_map(rt, "m", {"a": {"n": 1}, "b": {"n": 2}})
    seen = []

    def n(k, v):
        seen.append(k)
        return v["n"]

    s = m.map(n).sum()
    with rt:
        assert s() == 3
    seen.clear()
    m.get("a")["n"] = 5
    m.set("a", m.get("a"))
    with rt:
        assert s() == 7
    assert seen == ["a"]
    seen.clear()
    d = {"n": 10}
    m.set("b", d)
    with rt:
        assert s() == 15
    d["n"] = 20                              # the object given, changed after the set
    m.set("b", d)                            # ... compared with the map's own copy
    with rt:
        assert s() == 25
    assert seen == ["b", "b"]


def test_a_per_key_read_inside_a_cell_sees_a_mutated_value_set_again():
    rt = incr.Runtime()
    m = incr.input_map(rt, "m", {"a": [1]})
    runs = []

    @incr.cell
    def first():
        runs.append(1)
        return m["a"][0]

    with rt:
        assert first() == 1
    m.get("a")[0] = 9
    m.set("a", m.get("a"))
    with rt:
        assert first() == 9
    assert len(runs) == 2


def _pass_with_change(change):
    rt = incr.Runtime()
    m = incr.input_map(rt, "m", {i: i for i in range(4)})
    inside, done = threading.Event(), threading.Event()
    runs = []

    @incr.cell
    def f(k, v):
        runs.append(k)
        if k == 3 and not inside.is_set():
            inside.set()
            done.wait(10)
        return v * 10

    mm = m.map(f)
    seen = []

    @incr.cell
    def late():
        seen.append((dict(mm()), dict(m.items())))
        return len(mm())

    o = rt.observe(late)
    errors = []

    def other():
        inside.wait(10)
        try:
            change(m)
        except BaseException as e:           # noqa: BLE001 - reported by the test
            errors.append(e)
        finally:
            done.set()

    t = threading.Thread(target=other)
    t.start()
    rt.stabilize()
    t.join(10)
    assert not errors, errors
    assert inside.is_set()
    before = {i: i for i in range(4)}
    assert seen == [({i: i * 10 for i in range(4)}, before)]   # the pass saw revision R only
    runs.clear()
    rt.stabilize()
    return runs, rt, m, o, seen


@pytest.mark.parametrize("what,ran,want", [
    ("set", [0], {0: 100, 1: 1, 2: 2, 3: 3}),
    ("delete", [], {0: 0, 1: 1, 3: 3}),
    ("update", [1, 9], {0: 0, 1: 7, 2: 2, 3: 3, 9: 9}),
])
def test_a_change_from_another_thread_mid_pass_is_the_next_revision(what, ran, want):
    change = {"set": lambda m: m.set(0, 100), "delete": lambda m: m.delete(2),
              "update": lambda m: m.update({9: 9, 1: 7})}[what]
    runs, rt, m, o, seen = _pass_with_change(change)
    assert sorted(runs) == ran                          # only the changed keys ran again
    assert dict(m.items()) == want and seen[-1][1] == want
    assert o.value == len(want)
    rt._check()


def test_update_refuses_a_str_as_delete_and_a_key_of_another_kind_changing_nothing():
    rt = incr.Runtime()
    m = incr.input_map(rt, "m", {"a": 1, "b": 2, "ab": 3})
    runs = []
    r = m.map(_counted(runs))
    with rt:
        r()
    runs.clear()
    rev = rt.revision
    with pytest.raises(TypeError, match="delete="):
        m.update({}, delete="ab")
    with pytest.raises(TypeError, match="delete="):
        m.update({}, delete=b"ab")
    with pytest.raises(TypeError, match="update: key 5"):
        m.update({"a": 10, 5: 5}, delete=["b"])
    assert rt.revision == rev and dict(m.items()) == {"a": 1, "b": 2, "ab": 3}
    with rt:
        r()
    assert runs == []
    m.update({}, delete=["ab"])
    with rt:
        assert dict(r()) == {"a": "1", "b": "2"}
    assert runs == []                            # (a deleted key runs nothing)


def test_a_sum_over_bools_is_the_int_plain_sum_gives_after_any_history():
    rt = incr.Runtime()
    m = incr.input_map(rt, "m", {"a": True})
    total = m.sum()
    for step in [lambda: m.set("b", 0.5), lambda: m.delete("b"), lambda: m.set("c", False),
                 lambda: m.delete("a")]:
        step()
        with rt:
            got = total()
        want = sum(m.values())
        assert got == want and type(got) is type(want), (got, want)


def test_a_collection_read_inside_a_cell_of_another_runtime_is_refused_naming_it():
    rt1, rt2 = incr.Runtime(), incr.Runtime()
    m2 = incr.input_map(rt2, "m2", {"a": 1})
    tot2 = m2.sum()
    runs = []

    @incr.cell
    def via_fold():
        runs.append(1)
        return tot2()

    @incr.cell
    def via_get():
        return m2.get("a")

    with rt1:
        with pytest.raises(incr.IncrError, match="m2.sum belongs to another runtime"):
            via_fold()
        with pytest.raises(incr.IncrError, match="m2 belongs to another runtime"):
            via_get()
    with rt2:                                   # on its own runtime: tracked as usual
        assert via_fold() == 1
        m2.set("a", 5)
        assert via_fold() == 5
    assert len(runs) == 3
    assert tot2() == 5 and m2.get("a") == 5     # outside any cell: a plain read


@pytest.mark.parametrize("bad", [("a", 1), (None,), (1, None), (b"x",), ((1,),), (1, ("a",))])
def test_a_tuple_key_whose_parts_cannot_be_ordered_with_the_others_changes_nothing(bad):
    rt = incr.Runtime()
    m = incr.input_map(rt, "tm", {(1, "a"): 1, (2, "b", 3): 2})
    runs = []
    r = m.map(_counted(runs))
    with rt:
        r()
    runs.clear()
    rev = rt.revision
    for change in (lambda: m.set(bad, 5), lambda: m.update({(3, "c"): 3, bad: 5})):
        with pytest.raises(TypeError, match=r"tm.*cannot be ordered"):
            change()
    with pytest.raises(TypeError, match="cannot be ordered"):
        incr.input_map(rt, "tm2", {(1, "a"): 1, bad: 2})
    assert rt.revision == rev and list(m) == [(1, "a"), (2, "b", 3)]
    m.set((1,), 0)                                  # a shorter prefix orders fine
    m.set((0, "z", 9, "x"), 0)                      # and so does a longer one
    with rt:
        assert list(r()) == sorted([(1, "a"), (2, "b", 3), (1,), (0, "z", 9, "x")])
    assert sorted(runs) == [(0, "z", 9, "x"), (1,)]
    incr.input_map(rt, "tm2", {(1, "a"): 1})        # the refused name was not taken
    m.update({}, delete=list(m))                    # emptied: any shape again
    m.set(bad, 1)
    assert list(m) == [bad]


def test_map_keys_making_keys_that_cannot_be_ordered_names_the_operator():
    rt = incr.Runtime()
    m = incr.input_map(rt, "m", {1: 1, 2: 2})
    out = m.map_keys(lambda k: (k,) if k > 1 else ("s",))
    with rt:
        with pytest.raises(TypeError, match=r"map_keys.*cannot be ordered"):
            out()
