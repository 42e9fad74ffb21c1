"""Attacks interrupts: Ctrl-C (KeyboardInterrupt) at random points of ``stabilize()`` and of
top-level demands, in memory and on a store, and callbacks that raise.

- Timed: SIGALRM from ``signal.setitimer`` raises KeyboardInterrupt at a random microsecond
  offset into the call — inside a cell, between cells, in the engine's Python parts, in the
  store's commit, in a callback.
- Deterministic: a cell raises KeyboardInterrupt at its k-th call, for every k of a pass (and a
  callback at its k-th call).
- Raising callbacks: some ``on_change`` callbacks raise; the others must still be told.

After each interrupt ``rt._check()`` must pass (I5: every observed instance is up to date or
queued for the next pass); later, one uninterrupted ``stabilize()`` must bring every observed
value to the from-scratch value, and every callback must have seen that final value (a
notification is never lost). With a store, a new runtime on it must then give from-scratch
values too.
"""

from __future__ import annotations

import gc
import random
import signal
import time
import warnings

import pytest

import incr
import incr.store
from chaos_util import chaos  # noqa: F401 - a fixture

pytestmark = pytest.mark.hang_limit(300)

N_INPUTS = 4
N_CELLS = 18


# -- the programs, and their from-scratch evaluation --------------------------------------------

def make_programs(rng):
    progs = []
    for i in range(N_CELLS):
        pool = [("x", k) for k in range(N_INPUTS)] + [("c", j) for j in range(max(0, i - 6), i)]
        progs.append({"cond": rng.choice(pool), "a": rng.choice(pool), "b": rng.choice(pool),
                      "c": rng.choice(pool), "mod": rng.choice([3, 7, 11, 101])})
    return progs


def run_program(prog, read):
    """One cell's body, shared by the engine and the oracle: a branch chosen by data."""
    if read(prog["cond"]) % 2 == 0:
        v = read(prog["a"]) + read(prog["b"])
    else:
        v = 3 * read(prog["c"]) + 1
    return v % prog["mod"]


def scratch(progs, values):
    """Every cell's value, computed from nothing."""
    memo = {}

    def read(src):
        kind, k = src
        if kind == "x":
            return values[k]
        if k not in memo:
            memo[k] = run_program(progs[k], read)
        return memo[k]

    return [read(("c", i)) for i in range(len(progs))]


class Tripwire:
    """Raises KeyboardInterrupt at its k-th call after ``arm(k)``."""

    def __init__(self):
        self.left = 0

    def arm(self, k):
        self.left = k

    def __call__(self):
        if self.left > 0:
            self.left -= 1
            if self.left == 0:
                raise KeyboardInterrupt("tripwire")


def spin(n=300):
    # a little work, so that a timer has somewhere to land inside a cell or callback
    s = 0
    for i in range(n):
        s += i
    return s


class Graph:
    """The programs as cells. The cells stay the same objects for every runtime (``attach``),
    with an exact identity (``version``), so that a new runtime on a store finds their
    entries."""

    def __init__(self, progs, values, tag):
        self.progs = progs
        self.values = list(values)
        self.inputs = []
        self.trip = Tripwire()
        self.cells = [self._cell(i, p, tag) for i, p in enumerate(progs)]

    def _cell(self, i, prog, tag):
        g = self

        def read(src):
            kind, k = src
            return g.inputs[k].get() if kind == "x" else g.cells[k]()

        def body():
            g.trip()
            spin()
            return run_program(prog, read)

        body.__qualname__ = f"chaos_c{i}"
        return incr.cell(body, version=f"{tag}:{i}:{sorted(prog.items())}")

    def attach(self, rt):
        self.rt = rt
        self.inputs = [rt.input(f"x{k}", v) for k, v in enumerate(self.values)]

    def change(self, rng):
        """One to three input changes, sometimes as a batch."""
        changes = [(rng.randrange(N_INPUTS), rng.randrange(10)) for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.3:
            with self.rt.batch():
                for k, v in changes:
                    self.values[k] = v
                    self.inputs[k].set(v)
        else:
            for k, v in changes:
                self.values[k] = v
                self.inputs[k].set(v)

    def want(self):
        return scratch(self.progs, self.values)


class Watch:
    """Observers of some cells, each with two callbacks that log every value they are given."""

    def __init__(self, graph, which, trip=None, middle=None):
        self.graph = graph
        self.which = which
        self.obs = {i: graph.rt.observe(graph.cells[i]) for i in which}
        self.trip = trip or (lambda: None)
        graph.rt.stabilize()     # (observing may be lazy: compute them now)
        self.seen = {}
        for i, o in self.obs.items():
            for side in (0, 1):
                self.seen[(i, side)] = [o.value]
                o.on_change(self._logger(i, side))
                if side == 0 and middle is not None:
                    o.on_change(middle)     # between the two loggers

    def _logger(self, i, side):
        def cb(value):
            self.seen[(i, side)].append(value)   # seen first; an interrupt may land after
            self.trip()
            spin(100)
        return cb

    def check_final(self, chaos):
        """After an uninterrupted stabilize: every observed value and every callback's last
        value equal from-scratch."""
        want = self.graph.want()
        wrong = [(i, o.value, want[i]) for i, o in self.obs.items() if o.value != want[i]]
        lost = [(key, log[-1], want[key[0]]) for key, log in self.seen.items()
                if log[-1] != want[key[0]]]
        chaos.count("wrong_values", len(wrong))
        chaos.count("lost_notifications", len(lost))
        assert wrong == [], f"observed values differ from scratch (cell, got, want): {wrong}"
        assert lost == [], f"callbacks never saw the final value ((cell, cb), saw, want): {lost}"


def interrupt_only(e):
    """True if ``e`` is a KeyboardInterrupt, or a group of nothing else."""
    if isinstance(e, KeyboardInterrupt):
        return True
    if isinstance(e, BaseExceptionGroup):
        return all(interrupt_only(x) for x in e.exceptions)
    return False


class Alarm:
    """SIGALRM raising KeyboardInterrupt, armed for one call at a time."""

    def __init__(self):
        self.armed = False
        self.old = signal.signal(signal.SIGALRM, self._handler)

    def _handler(self, signum, frame):
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt("alarm")

    def call(self, after, fn):
        """fn() with a KeyboardInterrupt due ``after`` seconds in; True if it was interrupted."""
        try:
            self.armed = True
            signal.setitimer(signal.ITIMER_REAL, after)
            try:
                fn()
            finally:
                self.armed = False
                signal.setitimer(signal.ITIMER_REAL, 0)
        except BaseException as e:
            if not interrupt_only(e):
                raise
            return True
        return False

    def close(self):
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.old)


@pytest.fixture
def alarm():
    a = Alarm()
    yield a
    a.close()


def new_runtime(tmp_path, on_store):
    return incr.Runtime(store=tmp_path / "store") if on_store else incr.Runtime()


def check_store_afresh(tmp_path, graph, chaos):
    """Close the runtime; a new one on the same store gives from-scratch values."""
    graph.rt.close()
    gc.collect()
    rt = incr.Runtime(store=tmp_path / "store")
    graph.attach(rt)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with rt:
                got = [c() for c in graph.cells]
        rt._check()
    finally:
        rt.close()
    want = graph.want()
    wrong = [(i, g, w) for i, (g, w) in enumerate(zip(got, want)) if g != w]
    chaos.count("wrong_values_after_reopen", len(wrong))
    assert wrong == [], wrong
    damaged = [str(w.message) for w in caught
               if issubclass(w.category, incr.store.DamagedRecordWarning)]
    assert damaged == [], damaged


@pytest.mark.parametrize("on_store", [False, True], ids=["memory", "store"])
def test_ctrl_c_at_random_microseconds(tmp_path, chaos, alarm, on_store):
    rng = random.Random(8 + on_store)
    graph = Graph(make_programs(rng), [rng.randrange(10) for _ in range(N_INPUTS)], "timed")
    graph.attach(new_runtime(tmp_path, on_store))
    watch = Watch(graph, sorted(rng.sample(range(N_CELLS), 6)))
    rt = graph.rt
    # how long a pass that recomputes most of the graph takes: offsets are drawn up to 1.5x it
    for k in range(N_INPUTS):
        graph.inputs[k].set(graph.values[k] + 10)
        graph.values[k] += 10
    t0 = time.perf_counter()
    rt.stabilize()
    span = max(time.perf_counter() - t0, 200e-6)
    watch.check_final(chaos)

    for _ in chaos.rounds(400, 15):
        graph.change(rng)
        if rng.random() < 0.7:
            hit = alarm.call(rng.uniform(1e-6, 1.5 * span), rt.stabilize)
            chaos.count("stabilize_interrupted" if hit else "stabilize_completed")
        else:
            i = rng.randrange(N_CELLS)
            got = []

            def demand():
                with rt:
                    got.append(graph.cells[i]())

            hit = alarm.call(rng.uniform(1e-6, span), demand)
            chaos.count("demand_interrupted" if hit else "demand_completed")
            if not hit:
                assert got == [graph.want()[i]], f"c{i}: got {got}, want {graph.want()[i]}"
        rt._check()
        if rng.random() < 0.3:
            rt.stabilize()
            rt._check()
            watch.check_final(chaos)
            chaos.count("recoveries")
    rt.stabilize()
    rt._check()
    watch.check_final(chaos)
    if on_store:
        check_store_afresh(tmp_path, graph, chaos)


@pytest.mark.parametrize("on_store", [False, True], ids=["memory", "store"])
def test_ctrl_c_at_every_cell_run_and_callback(tmp_path, chaos, on_store):
    rng = random.Random(80 + on_store)
    graph = Graph(make_programs(rng), [rng.randrange(10) for _ in range(N_INPUTS)], "tripwire")
    graph.attach(new_runtime(tmp_path, on_store))
    cb_trip = Tripwire()
    watch = Watch(graph, sorted(rng.sample(range(N_CELLS), 6)), trip=cb_trip)
    rt = graph.rt
    for rnd in chaos.rounds(40, 15):
        # a change, then a pass (or a demand) interrupted at its k-th cell run or callback,
        # for every k until one runs through
        graph.change(rng)
        target = rng.choice(["stabilize", "stabilize", "demand", "callback"])
        i = rng.randrange(N_CELLS)
        for k in range(1, 200):
            if target == "callback":
                cb_trip.arm(k)
            else:
                graph.trip.arm(k)
            try:
                if target == "demand":
                    with rt:
                        graph.cells[i]()
                else:
                    rt.stabilize()
            except BaseException as e:
                if not interrupt_only(e):
                    raise
                chaos.count(f"{target}_interrupted")
                rt._check()
                if rng.random() < 0.5:
                    graph.change(rng)        # a change between the interrupt and the retry
                continue
            finally:
                graph.trip.arm(0)
                cb_trip.arm(0)
            break
        rt.stabilize()
        rt._check()
        watch.check_final(chaos)
        with rt:
            assert graph.cells[i]() == graph.want()[i]
    if on_store:
        check_store_afresh(tmp_path, graph, chaos)


class Flaky(Exception):
    pass


def test_raising_callbacks_do_not_silence_the_others(chaos):
    rng = random.Random(7)
    graph = Graph(make_programs(rng), [rng.randrange(10) for _ in range(N_INPUTS)], "callbacks")
    graph.attach(incr.Runtime())
    rt = graph.rt
    raising = set()

    def boom(_value):
        if raising and rng.random() < 0.5:
            raise Flaky("a callback failed")

    # a callback that sometimes raises, between the two logging ones of every observer
    watch = Watch(graph, sorted(rng.sample(range(N_CELLS), 6)), middle=boom)
    for _ in chaos.rounds(150, 8):
        raising.add(1)
        graph.change(rng)
        try:
            rt.stabilize()
            chaos.count("passes_clean")
        except (Flaky, ExceptionGroup) as e:
            if isinstance(e, ExceptionGroup):
                assert all(isinstance(x, Flaky) for x in e.exceptions), e
            chaos.count("passes_with_raising_callbacks")
        rt._check()
        # every logging callback saw the new value in this very pass
        want = graph.want()
        behind = [(key, log[-1], want[key[0]]) for key, log in watch.seen.items()
                  if log[-1] != want[key[0]]]
        chaos.count("lost_notifications", len(behind))
        assert behind == [], f"a raising callback kept others from being called: {behind}"
    raising.clear()
    rt.stabilize()
    watch.check_final(chaos)
