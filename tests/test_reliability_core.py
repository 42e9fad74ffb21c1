"""Regression tests for the engine items of the reliability pass: each failed on the code
before it (a silently wrong value, a lost notification, or a crash) and names the item.

Values are compared with the plain function on the same arguments (from-scratch
evaluation); every test that keeps a runtime calls ``rt._check()``.
"""

import math
import subprocess
import sys
import textwrap

import pytest

import incr


# -- arguments are the instance's own (item 2) ------------------------------------------------

def test_argument_mutated_after_the_call_does_not_change_the_instance():
    rt = incr.Runtime()
    x = rt.input("x", 0)
    runs = []

    @incr.cell
    def total(buf):
        runs.append(list(buf))
        return sum(buf) + x.get()

    with rt:
        buf = [1, 2]
        assert total(buf) == 3
        buf.append(100)            # the caller's list changes after the call
        x.set(1)                   # the instance [1, 2] must re-run on [1, 2]
        assert total([1, 2]) == 4
        assert runs == [[1, 2], [1, 2]]
        assert total(buf) == 104   # [1, 2, 100] is another instance
    rt._check()


def test_argument_mutated_inside_the_cell_is_fresh_on_every_run():
    rt = incr.Runtime()
    x = rt.input("x", 0)

    @incr.cell
    def grow(buf, extra):
        buf.append(x.get())
        extra["seen"] = True
        return (len(buf), sorted(extra))

    with rt:
        assert grow([0], {}) == (2, ["seen"])
        x.set(1)
        assert grow([0], {}) == (2, ["seen"])
        x.set(2)
        assert grow([0], {}) == (2, ["seen"])
    rt._check()


def test_nested_and_registered_arguments_are_copied():
    class Box:
        def __init__(self, items):
            self.items = items

    incr.register_type(Box, lambda b: list(b.items), Box)
    rt = incr.Runtime()
    x = rt.input("x", 0)

    @incr.cell
    def size(b, nested):
        b.items.append(1)
        nested[0].append(1)
        return len(b.items) + len(nested[0]) + x.get()

    box, nested = Box([]), ([],)
    with rt:
        assert size(box, nested) == 2
        assert box.items == [] and nested == ([],)   # the caller's objects are untouched
        x.set(10)
        assert size(Box([]), ([],)) == 12
    rt._check()


def test_argument_mutation_does_not_reach_the_store(tmp_path):
    rt = incr.Runtime(store=str(tmp_path / "s"))
    x = rt.input("x", 0)

    @incr.cell(version="1")
    def total(buf):
        return sum(buf) + x.get()

    with rt:
        buf = [1, 2]
        total(buf)
        buf.append(100)
        x.set(1)
        assert total([1, 2]) == 4
    rt.close()
    rt2 = incr.Runtime(store=str(tmp_path / "s"))
    rt2.input("x", 1)
    with rt2:
        assert total([1, 2]) == 4
    assert rt2.stats()["store_hits"] >= 1
    rt2.close()


# -- values round-trip exactly (item 3) ------------------------------------------------------

ORDERED = [
    {"zeta": 1, "alpha": 2},
    [{"b": 1, "a": {"y": 1, "x": 2}}],
    ({"z": 0.0, "a": -0.0},),
    {"k": (1, {"q": 1, "p": 2})},
]


@pytest.mark.parametrize("value", ORDERED)
def test_store_returns_the_value_in_its_order(tmp_path, value):
    path = str(tmp_path / "s")
    script = textwrap.dedent(f"""
        import incr, json
        rt = incr.Runtime(store={path!r})
        @incr.cell(version="1")
        def make():
            return {value!r}
        salt = rt.input("salt", sys.argv[1])
        @incr.cell(version="1")
        def walk():
            return repr(make()) + salt.get()
        with rt:
            print(walk())
            print(rt.stats()["store_hits"])
        rt.close()
    """)
    # the second process changes salt: walk runs again on make's value from the store
    first = subprocess.run([sys.executable, "-c", "import sys\n" + script, ""],
                           capture_output=True, text=True, check=True).stdout.split("\n")
    second = subprocess.run([sys.executable, "-c", "import sys\n" + script, "!"],
                            capture_output=True, text=True, check=True).stdout.split("\n")
    assert first[0] == repr(value)
    assert second[0] == repr(value) + "!"    # the same text: order and -0.0 kept
    assert int(second[1]) >= 1               # and it did come from the store


def test_value_encoding_keeps_order_and_key_encoding_sorts():
    from incr import keys
    a, b = {"zeta": 1, "alpha": 2}, {"alpha": 2, "zeta": 1}
    assert keys.encode(a) == keys.encode(b)                 # one instance for equal dicts
    assert keys.encode_value(a) != keys.encode_value(b)     # two values: they iterate apart
    assert list(keys.decode(keys.encode_value(a))) == ["zeta", "alpha"]


def test_reordered_dict_is_a_change_for_cutoff():
    rt = incr.Runtime()
    order = rt.input("order", ("a", "b"))
    runs = []

    @incr.cell
    def make():
        return {k: 1 for k in order.get()}

    @incr.cell
    def keys_of():
        runs.append(1)
        return list(make())

    with rt:
        assert keys_of() == ["a", "b"]
        order.set(("b", "a"))
        assert keys_of() == ["b", "a"]       # from scratch gives this
        assert len(runs) == 2
    rt._check()


# -- Input.value, untracked reads (item 4) ---------------------------------------------------

def test_input_value_is_read_only():
    rt = incr.Runtime()
    x = rt.input("x", 1)
    with pytest.raises(AttributeError):
        x.value = 5
    assert x.value == 1 and x.get() == 1 and x.peek() == 1


def test_untracked_reads_record_nothing():
    rt = incr.Runtime()
    x = rt.input("x", 1)
    y = rt.input("y", 10)
    runs = []

    @incr.cell
    def sq():
        return y.get() ** 2

    @incr.cell
    def f():
        runs.append(1)
        with incr.untracked():
            seen = (x.get(), sq())
        return seen, x.peek(), incr.untracked(lambda: x.get() + 1)

    with rt:
        assert f() == ((1, 100), 1, 2)
        x.set(2)
        y.set(3)
        assert f() == ((1, 100), 1, 2)     # nothing it read was recorded
        assert runs == [1]
        assert sq() == 9                   # sq itself stays incremental
        assert [type(d).__name__ for d in rt._instance(f, (), {})._deps] == []
    rt._check()


def test_untracked_without_function_and_outside_cells():
    rt = incr.Runtime()
    x = rt.input("x", 3)
    with rt:
        assert incr.untracked(x.get) == 3
        with incr.untracked():
            assert x.get() == 3
    with pytest.raises(TypeError):
        incr.untracked(42)
    with pytest.raises(TypeError):
        incr.untracked(None, 1)


# -- one rule for the same value: -0.0, NaN, nested types (item 5) ----------------------------

def test_negative_zero_is_a_change_for_inputs_and_cutoff():
    rt = incr.Runtime()
    x = rt.input("x", 0.0)

    @incr.cell
    def sign():
        return math.copysign(1.0, x.get())

    @incr.cell
    def ident():
        return x.get()

    @incr.cell
    def sign_of_ident():
        return math.copysign(1.0, ident())

    with rt:
        assert (sign(), sign_of_ident()) == (1.0, 1.0)
        r = rt.revision
        x.set(-0.0)
        assert rt.revision == r + 1
        assert (sign(), sign_of_ident()) == (-1.0, -1.0)   # from scratch
    rt._check()


def test_nan_is_the_same_value():
    rt = incr.Runtime()
    x = rt.input("x", float("nan"))
    runs = []

    @incr.cell
    def f():
        runs.append(1)
        return [x.get()]

    @incr.cell
    def g():
        runs.append(2)
        return len(f())

    with rt:
        g()
        r = rt.revision
        x.set(float("nan"))
        assert rt.revision == r         # the same value: no revision
        g()
    assert runs == [2, 1] or runs == [1, 2]
    rt._check()


def test_nested_types_are_compared():
    rt = incr.Runtime()
    x = rt.input("x", [1])

    @incr.cell
    def typ():
        return type(x.get()[0]).__name__

    with rt:
        assert typ() == "int"
        x.set([1.0])                  # == says equal; the value is not the same
        assert typ() == "float"
    rt._check()


# -- Ctrl-C inside stabilize (item 6) ----------------------------------------------------------

@pytest.mark.parametrize("store", [False, True])
@pytest.mark.parametrize("at", range(1, 6))
def test_interrupted_stabilize_keeps_every_observed_instance_queued(tmp_path, store, at):
    rt = incr.Runtime(store=str(tmp_path / "s") if store else None)
    x = rt.input("x", 0)
    calls = {"n": 0, "at": None}

    def tick():
        calls["n"] += 1
        if calls["n"] == calls["at"]:
            raise KeyboardInterrupt

    cells = []
    for i in range(4):
        def body(i=i):
            tick()
            return x.get() * 10 + i
        body.__qualname__ = f"leaf{i}"
        cells.append(incr.cell(version="1")(body))

    @incr.cell(version="1")
    def top():
        tick()
        return sum(c() for c in cells)

    seen = {}
    with rt:
        observers = [rt.observe(c) for c in cells] + [rt.observe(top)]
    for o in observers:
        o.on_change(lambda v, o=o: seen.__setitem__(o.label, v))
    x.set(1)
    calls["at"] = calls["n"] + at
    with pytest.raises(KeyboardInterrupt):
        rt.stabilize()
    rt._check()                                   # I5: up to date or queued
    rt.stabilize()
    rt._check()
    assert [o.value for o in observers] == [10, 11, 12, 13, 46]
    assert seen == {o.label: o.value for o in observers}   # every callback got its value
    rt.close()


def test_interrupted_callbacks_are_delivered_next_pass():
    rt = incr.Runtime()
    x = rt.input("x", 0)
    cells = [incr.cell(lambda i=i: x.get() + i) for i in range(3)]
    seen = []
    with rt:
        obs = [rt.observe(c) for c in cells]
    state = {"stop": True}

    def first(v):
        if state["stop"]:
            state["stop"] = False
            raise KeyboardInterrupt
        seen.append(("a", v))

    obs[0].on_change(first)
    obs[1].on_change(lambda v: seen.append(("b", v)))
    obs[2].on_change(lambda v: seen.append(("c", v)))
    x.set(5)
    with pytest.raises(KeyboardInterrupt):
        rt.stabilize()
    rt._check()
    rt.stabilize()                       # nothing changed since: the pending ones are delivered
    assert sorted(seen) == [("a", 5), ("b", 6), ("c", 7)]


# -- callbacks that raise (item 7) -------------------------------------------------------------

def test_a_raising_callback_does_not_lose_the_others():
    rt = incr.Runtime()
    x = rt.input("x", 0)
    a = incr.cell(lambda: x.get() + 1)
    b = incr.cell(lambda: x.get() + 2)
    got = []
    with rt:
        oa, ob = rt.observe(a), rt.observe(b)

    def bad(v):
        raise ValueError(f"bad {v}")

    oa.on_change(bad)
    oa.on_change(lambda v: got.append(("a", v)))
    ob.on_change(bad)
    ob.on_change(lambda v: got.append(("b", v)))
    x.set(1)
    with pytest.raises(BaseException) as info:
        rt.stabilize()
    excs = getattr(info.value, "exceptions", None) or info.value.incr_exceptions
    assert sorted(str(e) for e in excs) == ["bad 2", "bad 3"]
    assert sorted(got) == [("a", 2), ("b", 3)]
    x.set(2)
    with pytest.raises(BaseException):
        rt.stabilize()
    assert sorted(got) == [("a", 2), ("a", 3), ("b", 3), ("b", 4)]
    rt._check()


# -- observing an instance that fails (item 8) -------------------------------------------------

def test_observe_a_failing_instance_then_it_succeeds():
    rt = incr.Runtime()
    x = rt.input("x", 0)

    @incr.cell
    def inv():
        return 1 / x.get()

    with rt:
        o = rt.observe(inv)
    with pytest.raises(ZeroDivisionError):
        rt.stabilize()
    assert isinstance(o.error, ZeroDivisionError)
    with pytest.raises(ZeroDivisionError):
        o.value
    got = []
    o.on_change(got.append)
    rt._check()
    x.set(4)
    rt.stabilize()
    assert o.error is None and o.value == 0.25 and got == [0.25]
    x.set(0)
    with pytest.raises(ZeroDivisionError):
        rt.stabilize()
    assert isinstance(o.error, ZeroDivisionError)
    x.set(2)
    rt.stabilize()
    assert got == [0.25, 0.5] and o.error is None
    rt._check()


# -- threads and close (items 9, 14) -----------------------------------------------------------

def test_close_from_inside_a_cell_is_a_reentrancy_error(tmp_path):
    rt = incr.Runtime(store=str(tmp_path / "s"))

    @incr.cell
    def closer():
        rt.close()

    with rt:
        with pytest.raises(incr.ReentrancyError, match="close"):
            closer()
        assert not rt.closed
    rt._check()
    rt.close()


def test_close_from_another_thread_while_computing_never_crashes(tmp_path):
    # in a subprocess, so that a crash is a failed test and not a dead test run
    script = textwrap.dedent(f"""
        import random, threading, time, incr
        random.seed(7)
        for rnd in range(8):
            rt = incr.Runtime(store={str(tmp_path)!r} + "/s")
            x = rt.input("x", 0)
            @incr.cell(version="1")
            def leaf(i):
                return x.get() + i
            @incr.cell(version="1")
            def top():
                return sum(leaf(i) for i in range(100))
            with rt:
                obs = rt.observe(top)
            def closer():
                time.sleep(random.random() * 0.02)
                for _ in range(5000):
                    try:
                        rt.close()
                        return
                    except incr.IncrError:
                        time.sleep(0.0005)
            t = threading.Thread(target=closer)
            t.start()
            for k in range(150):
                try:
                    x.set(k + 1)
                    rt.stabilize()
                    assert obs.value == sum((k + 1) + i for i in range(100)), obs.value
                except incr.IncrError:
                    break
                if k % 10 == 9:
                    time.sleep(0.001)   # now and then a window for the closer between passes
            t.join()
            rt.close()
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.strip() == "ok"


def test_a_second_thread_gets_incr_error_while_the_first_stabilizes():
    import threading
    rt = incr.Runtime()
    x = rt.input("x", 0)
    inside, release = threading.Event(), threading.Event()

    @incr.cell
    def slow():
        if x.get() == 1:
            inside.set()
            release.wait(10)
        return x.get()

    with rt:
        rt.observe(slow)
    x.set(1)
    out = []
    t = threading.Thread(target=lambda: out.append(rt.stabilize()))
    t.start()
    assert inside.wait(10)
    for call in (rt.stabilize, rt.close, lambda: rt._demand_top(rt._instance(slow, (), {}))):
        with pytest.raises(incr.IncrError, match="another thread"):
            call()
    release.set()
    t.join()
    assert out and not rt.closed
    rt._check()


def test_other_threads_get_incr_error_while_stabilize_waits_for_llm_workers():
    # while stabilize() waits for generator threads, a demand of a stale cell, a nack and a
    # state read from an unrelated thread are refused with IncrError (they leaked the
    # engine's internal _Deferred, or raced the ledger)
    import threading
    rt = incr.Runtime(max_workers=2)
    topic = rt.input("topic", "t0")
    inside, release = threading.Event(), threading.Event()

    @incr.llm(version="1")
    def summary(i, *, previous=None, feedback=()):
        t = topic.get()
        if t != "t0":
            inside.set()
            release.wait(10)
        return f"{t}-{i}"

    @incr.cell
    def plain():
        return topic.get() + "!"

    with rt:
        obs = [rt.observe(summary, i) for i in range(2)]
        plain()
    topic.set("t1")
    done = []
    t = threading.Thread(target=lambda: done.append(rt.stabilize()))
    t.start()
    try:
        assert inside.wait(10)
        got = []
        for call in (lambda: rt._demand_top(rt._instance(plain, (), {})),
                     lambda: rt.nack(summary, 0, revision=1, case="c"),
                     lambda: rt.state(summary, 0)):
            try:
                call()
            except BaseException as e:
                got.append(type(e))
        assert got == [incr.IncrError, incr.IncrError, incr.IncrError], got
    finally:
        release.set()
        t.join()
    assert done and [o.value for o in obs] == ["t1-0", "t1-1"]
    with rt:
        assert plain() == "t1!"
    rt._check()


# -- found by the hostile pass after the fixes -----------------------------------------------

def test_cyclic_values_compare_and_end():
    rt = incr.Runtime()

    def tree():
        t = {"name": "root", "children": []}
        t["children"].append({"name": "leaf", "parent": t})
        return t

    x = rt.input("x", tree())
    r = rt.revision
    x.set(tree())                  # the same value, built again: no revision, and it returns
    assert rt.revision == r
    other = tree()
    other["children"][0]["name"] = "twig"
    x.set(other)
    assert rt.revision == r + 1

    @incr.cell
    def selfref():
        x.get()
        a = []
        a.append(a)
        return a

    with rt:
        selfref()
        x.set(tree())
        selfref()
    rt._check()


def test_frozenset_elements_keep_their_types():
    rt = incr.Runtime()
    s = rt.input("s", frozenset({1}))
    z = rt.input("z", 0)

    @incr.cell
    def kinds():
        return sorted(type(v).__name__ for v in s.get())

    @incr.cell
    def zero_set():
        return frozenset({-0.0}) if z.get() else frozenset({0.0})

    @incr.cell
    def text():
        return repr(zero_set())

    with rt:
        assert kinds() == ["int"] and text() == "frozenset({0.0})"
        s.set(frozenset({1.0}))
        z.set(1)
        assert kinds() == ["float"] and text() == "frozenset({-0.0})"
    rt._check()


def test_untracked_in_another_thread_changes_nothing_for_the_running_cell():
    import threading
    rt = incr.Runtime()
    x = rt.input("x", 1)
    entered, release, done = threading.Event(), threading.Event(), threading.Event()

    @incr.cell
    def f():
        entered.set()
        release.wait(5)
        return x.get() * 10

    def logger():
        entered.wait(5)
        with incr.untracked():
            x.peek()
            release.set()
            done.wait(5)

    t = threading.Thread(target=logger)
    t.start()
    with rt:
        assert f() == 10
    done.set()
    t.join()
    x.set(2)
    with rt:
        assert f() == 20          # its read of x was recorded
    rt._check()


def test_untracked_in_a_generator_is_untracked_with_workers_too():
    calls = {}
    for workers in (1, 4):
        rt = incr.Runtime(max_workers=workers)
        topic = rt.input("topic", "cats")
        verbose = rt.input("verbose", False)
        n = calls[workers] = []

        @incr.llm(version="1")
        def write(i, *, previous=None, feedback=()):
            incr.untracked(verbose.get)
            n.append(i)
            return f"about {topic.get()} {i}"

        with rt:
            obs = [rt.observe(write, i) for i in range(2)]
        topic.set("dogs")
        rt.stabilize()
        before = len(n)
        verbose.set(True)
        rt.stabilize()
        assert len(n) == before, (workers, n)      # not a dependency: no model call
        assert [o.value for o in obs] == ["about dogs 0", "about dogs 1"]
        rt._check()


def test_a_child_forked_while_another_thread_computes_gets_a_clear_error(tmp_path):
    script = textwrap.dedent(f"""
        import os, threading, time, incr
        rt = incr.Runtime(store={str(tmp_path / 's')!r})
        x = rt.input("x", 1)
        started = threading.Event()
        @incr.cell
        def slow():
            started.set()
            time.sleep(0.5)
            return x.get() + 1
        @incr.cell(version="1")
        def quick():
            return x.get() * 2
        t = threading.Thread(target=lambda: rt._demand_top(rt._instance(slow, (), {{}})))
        t.start()
        started.wait()
        pid = os.fork()
        if pid == 0:
            out = []
            try:
                with rt:
                    quick()
                out.append("used")
            except incr.IncrError as e:
                out.append("refused: " + str(e))
            rt.close()                                  # closing is fine
            rt2 = incr.Runtime(store={str(tmp_path / 's2')!r})
            y = rt2.input("y", 1)
            fresh = incr.cell(lambda: y.get() * 2)
            with rt2:
                out.append(str(fresh()))
            rt2.close()
            print("|".join(out), flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
        t.join()
        with rt:
            assert slow() == 2 and quick() == 2        # the parent goes on
        rt._check()
        rt.close()
    """)
    r = subprocess.run([sys.executable, "-W", "ignore", "-c", script], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "|" in r.stdout, (r.stdout, r.stderr[-2000:])
    refused, value = r.stdout.strip().split("|")
    assert refused.startswith("refused: ") and "forked" in refused and "new Runtime" in refused
    assert value == "2"


@pytest.mark.parametrize("spelling", ["./", ".//.", "sub/..", b"./"])
def test_the_current_directory_in_any_spelling_is_not_a_store(tmp_path, monkeypatch, spelling):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    with pytest.raises(ValueError, match="directory of its own"):
        incr.Runtime(store=spelling)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sub"]


@pytest.mark.parametrize("depth", [80, 3000])
def test_deeply_nested_argument_is_a_type_error_naming_cell_and_argument(depth):
    rt = incr.Runtime()

    @incr.cell
    def summarize(tree):
        return 1

    a = []
    for _ in range(depth):
        a = [a]
    with rt, pytest.raises(TypeError, match=r"summarize.*tree.*nested deeper"):
        summarize(a)
    cyc = []
    cyc.append(cyc)
    with rt, pytest.raises(TypeError, match=r"summarize.*tree"):
        summarize(cyc)
    rt._check()


def test_not_persistable_warning_names_the_users_line(tmp_path):
    rt = incr.Runtime(store=str(tmp_path / "s"))

    @incr.cell
    def opaque():
        return object()

    with rt, pytest.warns(incr.NotPersistableWarning, match="value") as caught:
        opaque()                      # the line the warning must point at
    assert caught[0].filename == __file__, (caught[0].filename, caught[0].lineno)
    assert "argument" not in str(caught[0].message)
    rt.close()
