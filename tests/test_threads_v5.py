"""Operations from other threads during a pass (issue 11, branch threads).

(1) ``rt.batch()`` from another thread while a pass is in flight collects its sets (and input
maps' set / delete / update) and applies them as ONE revision after the pass
(incr/_core_runtime.pxi Runtime._batch_open / _batch_close, apply_batch; the deferral is
set_input / defer_op in incr/_core_propagate.pxi). (2) A cycle that a flag closes only on a
later revision (q reads top behind a flag; top reads p; p reads r then q): a CycleError naming
the cycle, sync, with max_workers>1 and LLM nodes, and async; never a hang. (3) A hostile
round: Input.set / rt.nack / rt.halt / rt.resume / observe / unobserve / Observer.value from
other threads while passes run, os.fork, signal handlers calling rt.halt.

Every engine test asserts what was recomputed (counts of runs), and ``rt._check()`` (the trace
invariants) runs after each step. A hang shows as a traceback dump (faulthandler) and a failed
test, never a hung run.
"""

import asyncio
import faulthandler
import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

import incr

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HANG = 30          # seconds before a test's threads are taken as hung (a dump, then a failure)


@pytest.fixture(autouse=True)
def _hang_dump():
    # a hang shows every thread's stack on stderr, then the join timeouts fail the test
    faulthandler.dump_traceback_later(HANG * 2, exit=False)
    yield
    faulthandler.cancel_dump_traceback_later()


def _subprocess(code, timeout=60):
    """Run ``code`` in a fresh interpreter: (returncode or "HANG", output)."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    try:
        p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                           capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return "HANG", out
    return p.returncode, p.stdout + p.stderr


class Paused:
    """A pass held open: cell ``a`` (x + y, and m's values when given) waits at its first run
    until ``go`` is set; ``other(fn)`` runs fn in another thread once the pass is inside
    ``a``, and lets the pass go on when fn returns (or at ``release``)."""

    def __init__(self, rt, x, y, m=None):
        self.rt, self.inside, self.go = rt, threading.Event(), threading.Event()
        self.seen, self.errors = [], []
        paused = self

        @incr.cell
        def a():
            if not paused.inside.is_set():
                paused.inside.set()
                paused.go.wait(HANG)
            v = x.get() + y.get()
            if m is not None:
                v = (v, tuple(sorted(m.items())))
            paused.seen.append(v)
            return v

        self.a = a

    def other(self, fn, release=True):
        def run():
            self.inside.wait(HANG)
            try:
                fn()
            except BaseException as e:             # noqa: BLE001 - the test reports it
                self.errors.append(e)
            finally:
                if release:
                    self.go.set()

        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t


# -- (1) a batch from another thread during a pass -------------------------------------------

def test_a_batch_from_another_thread_is_one_revision_after_the_pass():
    rt = incr.Runtime()
    x, y = rt.input("x", 1), rt.input("y", 1)
    p = Paused(rt, x, y)
    o = rt.observe(p.a)
    inside_values = []

    def batch():
        with rt.batch():
            x.set(10)
            inside_values.append(x.peek())     # the body reads revision R (get: IncrError,
            y.set(20)                          # another thread computes)
        inside_values.append((x.peek(), y.peek(), rt.revision))   # queued: the pass runs

    t = p.other(batch)
    rt.stabilize()
    t.join(HANG)
    assert not t.is_alive() and p.errors == []
    assert p.seen == [2]                         # the pass in flight saw none of the batch
    assert inside_values == [1, (1, 1, 0)]
    assert rt.revision == 1                      # both sets: one revision
    assert (x.get(), y.get()) == (10, 20)
    assert x.changed_at_revision == y.changed_at_revision == 1
    rt._check()
    rt.stabilize()
    assert o.value == 30 and p.seen == [2, 30]   # one run for the batch
    rt._check()


def test_sets_without_a_batch_are_one_revision_each():
    # (the contrast: the same two sets without the batch are deferred one by one)
    rt = incr.Runtime()
    x, y = rt.input("x", 1), rt.input("y", 1)
    p = Paused(rt, x, y)
    rt.observe(p.a)

    def sets():
        x.set(10)
        y.set(20)

    t = p.other(sets)
    rt.stabilize()
    t.join(HANG)
    assert p.errors == [] and p.seen == [2]
    assert rt.revision == 2 and (x.changed_at_revision, y.changed_at_revision) == (1, 2)
    rt._check()


def test_an_exception_in_a_batch_from_another_thread_applies_nothing():
    rt = incr.Runtime()
    x, y = rt.input("x", 1), rt.input("y", 1)
    p = Paused(rt, x, y)
    o = rt.observe(p.a)

    def batch():
        with rt.batch():
            x.set(10)
            y.set(20)
            raise KeyError("in the body")

    t = p.other(batch)
    rt.stabilize()
    t.join(HANG)
    assert len(p.errors) == 1 and isinstance(p.errors[0], KeyError)
    assert p.seen == [2]
    assert rt.revision == 0 and (x.get(), y.get()) == (1, 1)
    rt.stabilize()
    assert o.value == 2 and p.seen == [2]        # nothing changed: nothing ran again
    rt._check()
    # and the runtime takes batches as before
    with rt.batch():
        x.set(3)
        y.set(4)
    rt.stabilize()
    assert rt.revision == 1 and o.value == 7 and p.seen == [2, 7]
    rt._check()


def test_a_nested_batch_that_raises_drops_only_its_own_sets():
    rt = incr.Runtime()
    x, y = rt.input("x", 1), rt.input("y", 1)
    z = rt.input("z", 1)
    p = Paused(rt, x, y)
    rt.observe(p.a)

    def batch():
        with rt.batch():
            x.set(10)
            with pytest.raises(ValueError):
                with rt.batch():
                    y.set(20)
                    z.set(30)
                    raise ValueError("inner")
            z.set(5)

    t = p.other(batch)
    rt.stabilize()
    t.join(HANG)
    assert p.errors == [] and p.seen == [2]
    assert (x.get(), y.get(), z.get()) == (10, 1, 5) and rt.revision == 1
    rt.stabilize()
    assert p.seen == [2, 11]
    rt._check()


def test_a_batch_opened_during_a_pass_and_closed_after_it_is_applied_at_its_close():
    rt = incr.Runtime()
    x, y = rt.input("x", 1), rt.input("y", 1)
    p = Paused(rt, x, y)
    o = rt.observe(p.a)
    opened, passed, closed = threading.Event(), threading.Event(), threading.Event()
    revs = []

    def batch():
        with rt.batch():
            x.set(10)
            p.go.set()                 # the pass goes on and ends while the batch is open
            passed.wait(HANG)
            revs.append(rt.revision)   # nothing of the batch yet
            y.set(20)
        revs.append(rt.revision)
        closed.set()

    t = p.other(batch, release=False)
    rt.stabilize()
    assert p.seen == [2] and rt.revision == 0
    passed.set()
    assert closed.wait(HANG)
    t.join(HANG)
    assert p.errors == [] and revs == [0, 1]
    assert (x.get(), y.get()) == (10, 20) and x.changed_at_revision == y.changed_at_revision
    rt.stabilize()
    assert o.value == 30 and p.seen == [2, 30]
    rt._check()


def test_input_map_changes_in_a_batch_from_another_thread_join_its_revision():
    rt = incr.Runtime()
    x, y = rt.input("x", 1), rt.input("y", 1)
    m = rt.input_map("m", {"a": 1, "b": 2})
    p = Paused(rt, x, y, m)
    o = rt.observe(p.a)

    def batch():
        with rt.batch():
            m.set("c", 3)
            x.set(10)
            m.delete("a")
            m.update({"b": 20, "d": 4}, delete=["c"])

    t = p.other(batch)
    rt.stabilize()
    t.join(HANG)
    assert p.errors == []
    assert p.seen == [(2, (("a", 1), ("b", 2)))]
    assert rt.revision == 1
    assert dict(m.items()) == {"b": 20, "d": 4} and x.get() == 10
    rt.stabilize()
    assert o.value == (11, (("b", 20), ("d", 4))) and len(p.seen) == 2
    rt._check()


def test_input_map_changes_in_a_raising_batch_from_another_thread_apply_nothing():
    rt = incr.Runtime()
    x, y = rt.input("x", 1), rt.input("y", 1)
    m = rt.input_map("m", {"a": 1})
    p = Paused(rt, x, y, m)
    rt.observe(p.a)

    def batch():
        with rt.batch():
            m.set("b", 2)
            m.update({"a": 5})
            raise RuntimeError("no")

    t = p.other(batch)
    rt.stabilize()
    t.join(HANG)
    assert [type(e) for e in p.errors] == [RuntimeError]
    assert dict(m.items()) == {"a": 1} and rt.revision == 0
    rt.stabilize()
    assert len(p.seen) == 1
    rt._check()


def test_a_batch_inside_a_running_cell_is_still_a_reentrancy_error():
    rt = incr.Runtime()
    x = rt.input("x", 1)

    @incr.cell
    def bad():
        with rt.batch():
            x.set(2)
        return 1

    with rt:
        with pytest.raises(incr.ReentrancyError):
            bad()
    assert x.get() == 1 and rt.revision == 0
    rt._check()


def test_the_same_thread_batch_keeps_its_sets_when_its_body_raises():
    # the documented contract of a batch made with no other pass running: not a transaction
    rt = incr.Runtime()
    x, y = rt.input("x", 1), rt.input("y", 1)
    with pytest.raises(KeyError):
        with rt.batch():
            x.set(2)
            raise KeyError("k")
    y.set(3)
    assert x.get() == 2 and rt.revision == 2
    rt._check()


# -- (2) a cycle that a flag closes on a later revision --------------------------------------

# q reads top() behind a flag; top reads p; p reads r then q. With the flag off there is no
# cycle; setting it makes q's new run read top, which is being verified (sync) or, for an async
# q whose step runs after the pass unwound, not on the stack at the read: the read was
# recorded, the demand met the cycle, and q's failure then recorded a cyclic edge that made
# raise_ts (incr/_core_execute.pxi) loop for ever -- the hang. Fixed there (drop_cycle_edges);
# the cycle's labels name every instance on it (cycle_labels, incr/_core_runtime.pxi; they
# named top -> q -> top, without p).

_CYCLE = r'''
import asyncio, faulthandler, json, sys
faulthandler.dump_traceback_later(40, exit=True)
import incr
mode, mw, how = sys.argv[1], sys.argv[2], sys.argv[3]
rt = incr.Runtime(max_workers=None if mw == "None" else int(mw))
flag, rv = rt.input("flag", False), rt.input("rv", 1)
runs = []

@incr.cell
def r():
    runs.append("r")
    return rv.get()

if mode == "llm":
    @incr.llm
    def q(*, previous=None, feedback=()):
        runs.append("q")
        return str(top() + 1) if flag.get() else "0"
elif mode == "llm_catch":
    @incr.llm
    def q(*, previous=None, feedback=()):
        runs.append("q")
        if not flag.get():
            return "0"
        try:
            return str(top() + 1)
        except incr.CycleError as e:
            runs.append("caught " + " ".join(e.cycle))
            return "-1"
elif mode == "async":
    @incr.cell
    async def q():
        runs.append("q")
        await asyncio.sleep(0)
        return (await top.aget()) + 1 if flag.get() else 0
elif mode == "async_catch":
    @incr.cell
    async def q():
        runs.append("q")
        await asyncio.sleep(0)
        if not flag.get():
            return 0
        try:
            return (await top.aget()) + 1
        except incr.CycleError:
            return -1
else:
    @incr.cell
    def q():
        runs.append("q")
        return top() + 1 if flag.get() else 0

@incr.cell
def p():
    runs.append("p")
    if mode == "gather":
        a, b = incr.gather(lambda: r(), lambda: q())
    else:
        a, b = r(), q()
    return a + int(b)

@incr.cell
def top():
    runs.append("top")
    return p()

out = {}
o = rt.observe(top)

def step(name):
    runs.clear()
    try:
        if how == "astabilize":
            asyncio.run(rt.astabilize())
        else:
            rt.stabilize()
        out[name] = ["ok", o.value]
    except incr.CycleError as e:
        out[name] = ["cycle", e.cycle]
    out[name + "_runs"] = list(runs)
    rt._check()

step("first")
flag.set(True)
step("cycle")
flag.set(False)
step("after")
rv.set(5)
step("again")
print(json.dumps(out))
'''


def _cycle(mode, mw="None", how="stabilize"):
    code, out = _subprocess(f"import sys; sys.argv = ['x', {mode!r}, {mw!r}, {how!r}]\n"
                            + _CYCLE, timeout=90)
    assert code == 0, out[-3000:]
    import json
    return json.loads(out.strip().splitlines()[-1])


def _counts(runs):
    return {k: runs.count(k) for k in set(runs)}


@pytest.mark.parametrize("mode,mw", [("sync", "None"), ("sync", "4"), ("gather", "4"),
                                     ("llm", "1")])
def test_a_cycle_closed_by_a_flag_is_a_cycle_error_naming_it(mode, mw):
    out = _cycle(mode, mw)
    assert out["first"] == ["ok", 1]
    assert _counts(out["first_runs"])["q"] == 1
    assert out["cycle"] == ["cycle", ["top()", "p()", "q()", "top()"]]
    assert _counts(out["cycle_runs"]) == {"q": 1, "p": 1, "top": 1}   # r is clean
    # usable afterwards: the flag off is the first graph again; r ran only when rv changed
    assert out["after"] == ["ok", 1] and "r" not in out["after_runs"]
    assert out["again"] == ["ok", 5] and _counts(out["again_runs"])["r"] == 1


@pytest.mark.parametrize("how", ["stabilize", "astabilize"])
def test_an_llm_node_closing_a_cycle_is_called_once_with_workers(how):
    # its generator runs ahead in a worker thread and reads top(), which was on the driver's
    # stack when the call was set aside: it meets there the CycleError the serial call meets
    # (incr.remote Ahead._call, _core_schedule.pxi _stack_cycles) instead of stopping and
    # being handed over again, round after round (33 calls before; 4 with only the guard in
    # ahead_wanted). Same answer, statuses and model calls as max_workers=1
    serial = _cycle("llm", "1", how)
    out = _cycle("llm", "4", how)
    assert out["cycle"] == serial["cycle"] == ["cycle", ["top()", "p()", "q()", "top()"]]
    assert _counts(out["cycle_runs"]) == _counts(serial["cycle_runs"]) == {
        "q": 1, "p": 1, "top": 1}
    for step in ("after", "again"):
        assert out[step] == serial[step]
        assert _counts(out[step + "_runs"]).get("q", 0) == _counts(serial[step + "_runs"]).get("q", 0)
    assert out["after"] == ["ok", 1] and out["again"] == ["ok", 5]


@pytest.mark.parametrize("how", ["stabilize", "astabilize"])
def test_an_llm_node_that_catches_the_cycle_it_closes_is_called_once_with_workers(how):
    # the CycleError met in the worker thread is caught by the generator, which goes on: its
    # outcome is kept (the read would raise the same error in the pass taking it), so the
    # model is called once, as with max_workers=1
    serial = _cycle("llm_catch", "1", how)
    out = _cycle("llm_catch", "4", how)
    assert serial["cycle"] == ["ok", 0]            # q caught it: "-1", and p is 1 + -1
    assert out["cycle"] == serial["cycle"]
    assert _counts(out["cycle_runs"]) == _counts(serial["cycle_runs"]) == {
        "q": 1, "caught top() p() q() top()": 1, "p": 1, "top": 1}
    assert out["after"] == serial["after"] == ["ok", 1]
    assert out["again"] == serial["again"] == ["ok", 5]


def test_an_outcome_met_at_a_cycle_is_kept_only_while_the_read_would_still_raise_it():
    # incr.llmnodes _ahead keeps the outcome of a call that met a CycleError running ahead
    # only if that instance is on the stack with the same cycle (_core._stack_cycles_hold)
    from incr import _core
    rt = incr.Runtime()

    @incr.cell
    def a():
        c = _core._stack_cycles(rt, rt._running())
        return c, _core._stack_cycles_hold(rt, list(c.items()))

    o = rt.observe(a)
    rt.stabilize()
    cycles, held = o.value
    assert [(n.label_text, labels) for n, labels in cycles.items()] == [("a()", ("a()", "a()"))]
    assert held                                                   # in a's run: it would
    assert not _core._stack_cycles_hold(rt, list(cycles.items()))  # a is on no stack now
    assert _core._stack_cycles(rt, None) is None                   # no frame: nothing to give


def test_an_llm_node_closing_a_cycle_with_workers_is_still_a_cycle_error():
    # (what holds with max_workers>1 despite the extra calls above)
    out = _cycle("llm", "4")
    assert out["cycle"] == ["cycle", ["top()", "p()", "q()", "top()"]]
    assert out["after"] == ["ok", 1] and out["again"] == ["ok", 5]


@pytest.mark.parametrize("how", ["stabilize", "astabilize"])
def test_an_async_cell_closing_a_cycle_does_not_hang(how):
    out = _cycle("async", "None", how)
    assert out["cycle"][0] == "cycle"
    assert out["cycle"][1] == ["q()", "top()", "p()", "q()"]   # met inside q's later step
    assert _counts(out["cycle_runs"]) == {"q": 1, "p": 1, "top": 1}
    assert out["after"] == ["ok", 1] and "r" not in out["after_runs"]
    assert out["again"] == ["ok", 5] and _counts(out["again_runs"])["r"] == 1


@pytest.mark.parametrize("how", ["stabilize", "astabilize"])
def test_an_async_cell_that_catches_the_cycle_does_not_hang(how):
    out = _cycle("async_catch", "None", how)
    assert out["cycle"] == ["ok", 0]             # q caught it: -1, and p is 1 + -1
    assert _counts(out["cycle_runs"]) == {"q": 1, "p": 1, "top": 1}
    assert out["after"] == ["ok", 1] and out["again"] == ["ok", 5]


# -- (3) a hostile round: other threads, forks and signals during passes --------------------

def test_sets_and_batches_from_another_thread_never_mix_within_a_pass():
    # a writer thread sets x and y together in batches, then z alone, while the main thread
    # stabilizes again and again: every run of top sees x == y (one batch, one revision) and
    # both readers agree on z (one pass, one revision)
    rt = incr.Runtime()
    x, y, z = rt.input("x", 0), rt.input("y", 0), rt.input("z", 0)
    seen = []

    @incr.cell
    def b():
        return (x.get(), z.get())

    @incr.cell
    def c():
        return (y.get(), z.get())

    @incr.cell
    def top():
        seen.append((b(), c()))
        return seen[-1]

    o = rt.observe(top)
    rt.stabilize()
    stop, errors, N = threading.Event(), [], 300
    refused = []

    def writer():
        try:
            for i in range(1, N + 1):
                with rt.batch():
                    x.set(i)
                    y.set(i)
                z.set(i)
        except BaseException as e:             # noqa: BLE001
            errors.append(e)
        finally:
            stop.set()

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    while not stop.is_set():
        try:
            rt.stabilize()
        except incr.IncrError as e:           # a batch applied at its close claims the runtime
            assert "another thread" in str(e)
            refused.append(e)
    t.join(HANG)
    assert errors == []
    rt.stabilize()
    assert o.value == ((N, N), (N, N))
    for (bx, bz), (cy, cz) in seen:
        assert bx == cy and bz == cz          # never a mix
    assert len(seen) <= rt.revision + 1       # at most one run of top per revision
    rt._check()


def test_batches_from_another_thread_during_astabilize_are_one_revision_each():
    rt = incr.Runtime()
    x, y = rt.input("x", 0), rt.input("y", 0)
    seen = []

    @incr.cell
    async def a():
        await asyncio.sleep(0)
        seen.append((x.get(), y.get()))
        return seen[-1]

    o = rt.observe(a)
    stop, errors, N = threading.Event(), [], 100

    def writer():
        try:
            for i in range(1, N + 1):
                with rt.batch():
                    x.set(i)
                    y.set(i)
        except BaseException as e:             # noqa: BLE001
            errors.append(e)
        finally:
            stop.set()

    async def main():
        t = threading.Thread(target=writer, daemon=True)
        t.start()
        while not stop.is_set():
            try:
                await rt.astabilize()
            except incr.IncrError as e:
                assert "another thread" in str(e)
            await asyncio.sleep(0)
        t.join(HANG)
        await rt.astabilize()

    asyncio.run(main())
    assert errors == []
    assert o.value == (N, N)
    assert all(vx == vy for vx, vy in seen)   # never half a batch
    assert len(seen) <= N + 1
    rt._check()


def _llm_pass(rt, block):
    """An LLM node whose generator waits for ``block`` at its first call (a pass held open)."""
    calls = []
    inside = threading.Event()

    @incr.llm
    def node(k, *, previous=None, feedback=()):
        calls.append(k)
        if not inside.is_set():
            inside.set()
            block.wait(HANG)
        return f"v{k}"

    return node, calls, inside


def test_operations_from_another_thread_during_a_pass_refuse_clearly():
    # rt.nack, rt.ack, rt.state, rt.observe, Observer.value and Observer.stop from another
    # thread while a pass runs: an IncrError that says another thread computes (never a
    # partial change); Input.set is deferred; rt.halt only sets a flag
    rt = incr.Runtime()
    block = threading.Event()
    node, calls, inside = _llm_pass(rt, block)
    x = rt.input("x", 1)

    @incr.cell
    def other():
        return x.get()

    o1 = rt.observe(node, 1)
    o_other = rt.observe(other)
    results = {}

    def attack():
        inside.wait(HANG)
        for name, fn in [
                ("nack", lambda: rt.nack(node, 1, revision=1, case="c")),
                ("ack", lambda: rt.ack(node, 1, revision=1, case="c")),
                ("state", lambda: rt.state(node, 1)),
                ("observe", lambda: rt.observe(other)),
                ("value", lambda: o_other.value),
                ("stop", lambda: o_other.stop()),
                ("stabilize", rt.stabilize),
                ("set", lambda: x.set(2))]:
            try:
                fn()
                results[name] = "ok"
            except incr.IncrError as e:
                # (observe and stabilize raise ReentrancyError, a subclass, or IncrError,
                # depending on whether the pass is inside a run or waiting for a run-ahead
                # round at that moment: both name the other thread)
                results[name] = ("IncrError", "another thread" in str(e))
            except BaseException as e:        # noqa: BLE001
                results[name] = repr(e)
        block.set()

    t = threading.Thread(target=attack, daemon=True)
    t.start()
    rt.stabilize()
    t.join(HANG)
    assert results == {
        "nack": ("IncrError", True), "ack": ("IncrError", True),
        "state": ("IncrError", True), "observe": ("IncrError", True),
        "value": ("IncrError", True), "stop": ("IncrError", True),
        "stabilize": ("IncrError", True), "set": "ok"}
    assert calls == [1] and o1.value == "v1"
    assert repr(o_other).endswith("active>") and x.get() == 2 and rt.revision == 1
    rt._check()
    rt.stabilize()
    assert o_other.value == 2 and calls == [1]
    rt._check()


def test_halt_from_another_thread_during_a_pass_stops_the_next_model_call():
    rt = incr.Runtime()
    block = threading.Event()
    calls = []
    inside = threading.Event()

    @incr.validator
    def never(candidate, k):
        return incr.NACK("always", counterexample=candidate)

    @incr.llm(validators=[never], budget=incr.Budget(max_attempts=50))
    def node(k, *, previous=None, feedback=()):
        calls.append(k)
        if not inside.is_set():
            inside.set()
            block.wait(HANG)
        return f"v{len(calls)}"

    def halter():
        inside.wait(HANG)
        rt.halt("stop from a thread")
        block.set()

    t = threading.Thread(target=halter, daemon=True)
    t.start()
    with rt:
        with pytest.raises(incr.NotAccepted) as ei:
            node(1)
    t.join(HANG)
    assert ei.value.reason == "halted" and "stop from a thread" in ei.value.report
    assert calls == [1]                       # the call in flight ended; no next call
    assert rt.halted == "stop from a thread"
    rt._check()
    # resumed from yet another thread while nothing runs: the demand calls again
    r = threading.Thread(target=rt.resume)
    r.start()
    r.join(HANG)
    assert rt.halted is None
    with rt:
        with pytest.raises(incr.NotAccepted) as ei:
            node(1)
    assert ei.value.reason == "budget" and len(calls) > 1
    rt._check()


def test_resume_from_another_thread_during_a_halted_pass_takes_effect_at_the_next_one():
    rt = incr.Runtime()
    calls = []

    @incr.llm
    def node(k, *, previous=None, feedback=()):
        calls.append(k)
        return f"v{k}"

    rt.halt("halted first")
    o = rt.observe(node, 1)
    with pytest.raises(incr.NotAccepted):
        rt.stabilize()
    assert calls == []
    t = threading.Thread(target=rt.resume)
    t.start()
    t.join(HANG)
    rt.stabilize()
    assert o.value == "v1" and calls == [1]
    rt._check()


def test_a_forked_child_after_a_pass_can_use_the_runtime():
    code, out = _subprocess("""
        import os, incr
        rt = incr.Runtime()
        x = rt.input("x", 1)
        runs = []
        @incr.cell
        def a():
            runs.append(1)
            return x.get() * 10
        o = rt.observe(a)
        rt.stabilize()
        pid = os.fork()
        if pid == 0:
            try:
                x.set(2)
                rt.stabilize()
                ok = o.value == 20 and len(runs) == 2
                with rt.batch():
                    x.set(3)
                rt.stabilize()
                ok = ok and o.value == 30 and len(runs) == 3
                rt._check()
                os._exit(0 if ok else 3)
            except BaseException as e:
                print("child:", repr(e), flush=True)
                os._exit(4)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
        x.set(5)
        rt.stabilize()
        print("parent", o.value, len(runs))
    """)
    assert code == 0, out
    assert "child 0" in out and "parent 50 2" in out, out


def test_a_child_forked_while_another_thread_computes_refuses_clearly():
    code, out = _subprocess("""
        import os, threading, incr
        rt = incr.Runtime()
        inside, go = threading.Event(), threading.Event()
        @incr.cell
        def slow():
            inside.set()
            go.wait(20)
            return 1
        t = threading.Thread(target=lambda: rt._demand_top(rt._instance(slow, (), {})))
        t.start()
        inside.wait(20)
        pid = os.fork()
        if pid == 0:
            try:
                rt.stabilize()
                os._exit(3)
            except incr.IncrError as e:
                os._exit(0 if "forked" in str(e) else 5)
        go.set()
        t.join(20)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
        rt._check()
        print("parent ok")
    """)
    assert code == 0, out
    assert "child 0" in out and "parent ok" in out, out



@pytest.mark.parametrize("how", ["stabilize", "astabilize", "workers"])
def test_a_signal_handler_calling_halt_stops_the_loop_before_its_next_call(how):
    rt = incr.Runtime(max_workers=4 if how == "workers" else None)
    calls = []

    @incr.validator
    def never(candidate, k):
        return incr.NACK("always", counterexample=candidate)

    @incr.llm(validators=[never], budget=incr.Budget(max_attempts=50))
    def node(k, *, previous=None, feedback=()):
        calls.append(k)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGUSR1)   # the handler runs in the main thread
        return f"v{len(calls)}"

    old = signal.signal(signal.SIGUSR1, lambda *_: rt.halt("signal"))
    try:
        o = rt.observe(node, 1)
        with pytest.raises(incr.NotAccepted) as ei:
            if how == "astabilize":
                asyncio.run(rt.astabilize())
            else:
                rt.stabilize()
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert ei.value.reason == "halted" and "signal" in ei.value.report
    # (in a worker thread, the signal waits for the main thread's next bytecode: at most
    # the call in flight on either side)
    assert 3 <= len(calls) <= 4
    n = len(calls)
    rt._check()
    rt.resume()
    with pytest.raises(incr.NotAccepted) as ei:
        rt.stabilize()
    assert ei.value.reason == "budget" and len(calls) > n and o.error is ei.value
    rt._check()


def test_a_pass_from_another_thread_never_sees_half_an_open_batch():
    rt = incr.Runtime()
    x, y = rt.input("x", 1), rt.input("y", 1)
    seen = []

    @incr.cell
    def a():
        seen.append((x.get(), y.get()))
        return seen[-1]

    o = rt.observe(a)
    rt.stabilize()
    opened, passed = threading.Event(), threading.Event()

    def batch():
        with rt.batch():
            x.set(10)
            opened.set()
            passed.wait(HANG)
            y.set(20)

    t = threading.Thread(target=batch, daemon=True)
    t.start()
    opened.wait(HANG)
    try:
        rt.stabilize()                    # refused (another thread holds the runtime) or a
    except incr.IncrError as e:           # pass on the revision before the batch
        assert "another thread" in str(e)
    passed.set()
    t.join(HANG)
    assert (10, 1) not in seen            # never half the batch
    assert x.changed_at_revision == y.changed_at_revision == rt.revision == 1
    rt.stabilize()
    assert o.value == (10, 20) and seen[-1] == (10, 20)
    rt._check()


def test_a_set_from_another_thread_while_a_batch_is_open_is_the_next_revision():
    """A batch opened with no pass running holds the runtime for its thread (Runtime._batch_enter):
    another thread's set meanwhile is deferred to the revision after the batch's, so no
    revision mixes the batch with it, and the one pass after sees all of it."""
    rt = incr.Runtime()
    x, y, z = rt.input("x", 1), rt.input("y", 1), rt.input("z", 1)
    seen = []

    @incr.cell
    def a():
        seen.append((x.get(), y.get(), z.get()))
        return seen[-1]

    o = rt.observe(a)
    rt.stabilize()
    r0 = rt.revision
    opened, done = threading.Event(), threading.Event()

    def other():
        opened.wait(HANG)
        z.set(30)                          # deferred: the batch holds the runtime
        done.set()

    t = threading.Thread(target=other, daemon=True)
    t.start()
    with rt.batch():
        x.set(10)
        opened.set()
        assert done.wait(HANG)
        assert z.peek() == 1 if hasattr(z, "peek") else True
        y.set(20)
    t.join(HANG)
    assert x.changed_at_revision == y.changed_at_revision == r0 + 1
    assert z.changed_at_revision == r0 + 2 == rt.revision
    rt.stabilize()
    assert o.value == (10, 20, 30) and len(seen) == 2
    rt._check()
