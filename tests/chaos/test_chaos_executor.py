"""Attacks ``Runtime(executor=...)``: cells shipped to an executor whose new run takes a branch
its last run did not — reading cells never computed, cells that raise, inputs it never read —
over random input changes, with random executor failures.

The executor here is in-process but faithful: each function is sent through cloudpickle and
back, as to a worker process (so a cell it calls is an ``incr.remote.CellRef`` there, which
reads only what the driver gave), and runs in a thread pool. Every observed value must equal
from-scratch evaluation after each ``stabilize()``, the errors must be the cells' own, and the
trace invariants must hold.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest

import incr
from chaos_util import chaos  # noqa: F401 - a fixture

cloudpickle = pytest.importorskip("cloudpickle")

pytestmark = pytest.mark.hang_limit(300)

N = 6


class Lost(Exception):
    """The executor itself failed (a worker died): incr must run the cell locally instead."""


class PickleExecutor:
    """submit/results like incr.adapters.dask, on threads; every call crosses cloudpickle."""

    def __init__(self, rng, fail_rate=0.0):
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="chaos-executor")
        self.rng = rng
        self.fail_rate = fail_rate
        self.shipped = 0
        self.failed = 0

    def submit(self, fn, *args):
        payload = cloudpickle.dumps((fn, args))
        self.shipped += 1
        doomed = self.rng.random() < self.fail_rate
        if doomed:
            self.failed += 1

        def work():
            if doomed:
                raise Lost("worker lost")
            f, a = cloudpickle.loads(payload)
            return cloudpickle.loads(cloudpickle.dumps(f(*a)))

        return self.pool.submit(work)

    def results(self, handles):
        out = []
        for h in handles:
            try:
                out.append((True, h.result()))
            except Exception as e:
                out.append((False, e))
        return out

    def close(self):
        self.pool.shutdown()


class Odd(Exception):
    pass


def plain(i, x, y):
    """What work(i) is, from nothing."""
    def helper(j):
        if (x + j) % 7 == 3:
            raise Odd(f"helper({j})")
        return x * 10 + j

    if (x + i) % 3 == 0:
        return ("input", x + i)
    if (x + i) % 3 == 1:
        try:
            return ("helper", helper(i) + helper(i + N))
        except Odd:
            return ("caught", y)
    return ("y", y * i)


def make(rt):
    x, y = rt.input("x", 0), rt.input("y", 1)

    @incr.cell(version="1")
    def helper(j):
        if (x.get() + j) % 7 == 3:
            raise Odd(f"helper({j})")
        return x.get() * 10 + j

    @incr.cell(version="1")
    def work(i):
        if (x.get() + i) % 3 == 0:
            return ("input", x.get() + i)
        if (x.get() + i) % 3 == 1:
            try:
                return ("helper", helper(i) + helper(i + N))   # often never computed before
            except Odd:
                return ("caught", y.get())
        return ("y", y.get() * i)

    return x, y, work


@pytest.mark.filterwarnings("ignore:incr. the executor could not run:RuntimeWarning")
@pytest.mark.parametrize("fail_rate", [0.0, 0.2], ids=["sound", "lossy"])
def test_shipped_cells_take_new_branches(chaos, fail_rate):
    rng = random.Random(17)
    ex = PickleExecutor(rng, fail_rate)
    rt = incr.Runtime(executor=ex)
    try:
        x, y, work = make(rt)
        obs = {i: rt.observe(work, i) for i in range(N)}
        vals = {"x": 0, "y": 1}
        for _ in chaos.rounds(60, 15):
            for _ in range(rng.randint(1, 2)):
                name = rng.choice(["x", "y"])
                vals[name] = rng.randrange(12)
                (x if name == "x" else y).set(vals[name])
            try:
                rt.stabilize()
            except Odd:
                pytest.fail("an exception work() catches escaped from stabilize")
            finally:
                chaos.count("passes")
            rt._check()
            for i, o in obs.items():
                want = plain(i, vals["x"], vals["y"])
                if o.value != want:
                    chaos.count("wrong_values")
                assert o.value == want, f"work({i}) with {vals}: got {o.value}, want {want}"
    finally:
        chaos.count("shipped", ex.shipped)
        chaos.count("executor_failures", ex.failed)
        rt.close()
        ex.close()
