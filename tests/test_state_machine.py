"""The engine against plain from-scratch evaluation, on random graphs with dynamic dependencies.

Each cell is a small program over inputs and lower-numbered cells: it reads a condition, then
one branch or the other (so its dependencies change with the data), reduces modulo a small
number (so recomputed values are often equal: cutoff), may raise, and may catch what a
dependency raised. After every step the machine checks values (or the exception) against a
plain recursive evaluation of the same programs, checks what ran, and calls ``rt._check()``.
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import incr

N_INPUTS = 4
MAX_CELLS = 9


class Boom(Exception):
    pass


@st.composite
def programs(draw, n_cells):
    progs = []
    for i in range(n_cells):
        pool = [("in", k) for k in range(N_INPUTS)] + [("cell", j) for j in range(i)]
        src = st.sampled_from(pool)
        progs.append(
            {
                "cond": draw(src),
                "a": draw(src),
                "b": draw(src),
                "c": draw(src),
                "mod": draw(st.sampled_from([2, 3, 5, 11])),
                "boom": draw(st.sampled_from([None, None, 3, 4])),
                "catch": draw(st.booleans()),
                "param": draw(st.booleans()),
            }
        )
    return progs


def evaluate(prog, read, arg):
    """One cell's body; ``read`` fetches a source. Shared by the engine and the oracle."""
    if prog["catch"]:
        try:
            cv = read(prog["cond"])
        except Boom:
            cv = 1
    else:
        cv = read(prog["cond"])
    if (cv + arg) % 2 == 0:
        v = read(prog["a"]) + read(prog["b"])
    else:
        v = read(prog["c"]) * 2 + 1
    if prog["boom"] is not None and v % 7 == prog["boom"]:
        raise Boom(f"v={v}")
    return v % prog["mod"]


class EngineVsScratch(RuleBasedStateMachine):
    @initialize(progs=st.integers(1, MAX_CELLS).flatmap(programs),
                values=st.lists(st.integers(0, 6), min_size=N_INPUTS, max_size=N_INPUTS))
    def build(self, progs, values):
        self.rt = self.new_runtime()
        self.values = list(values)
        self.inputs = [self.rt.input(f"x{k}", v) for k, v in enumerate(values)]
        self.progs = progs
        self.ran = Counter()
        self.cells = []
        self.observers = {}
        for i, prog in enumerate(progs):
            self.cells.append(self._make_cell(i, prog))

    def new_runtime(self):
        return incr.Runtime()

    def _make_cell(self, i, prog):
        inputs, cells, ran = self.inputs, self.cells, self.ran

        def read(src):
            kind, k = src
            if kind == "in":
                return inputs[k].get()
            return cells[k](0) if not progs_param(k) else cells[k](1)

        def progs_param(k):
            return self.progs[k]["param"]

        def body(arg):
            ran[(i, arg)] += 1
            return evaluate(prog, read, arg)

        body.__qualname__ = f"c{i}"
        return incr.cell(body, version=self.version_of(i, prog))

    def version_of(self, i, prog):
        return None

    # -- the oracle -------------------------------------------------------------------------

    def scratch(self, i, arg):
        memo = {}

        def value(j, a):
            if (j, a) not in memo:
                try:
                    memo[(j, a)] = ("ok", evaluate(self.progs[j], read, a))
                except Boom as e:
                    memo[(j, a)] = ("err", e)
            kind, v = memo[(j, a)]
            if kind == "err":
                raise Boom(str(v))
            return v

        def read(src):
            kind, k = src
            if kind == "in":
                return self.values[k]
            return value(k, 1 if self.progs[k]["param"] else 0)

        try:
            return ("ok", value(i, arg))
        except Boom:
            return ("err", None)

    def engine(self, i, arg):
        with self.rt:
            try:
                return ("ok", self.cells[i](arg))
            except Boom:
                return ("err", None)

    # -- rules -------------------------------------------------------------------------------

    @rule(k=st.integers(0, N_INPUTS - 1), v=st.integers(0, 6))
    def set_input(self, k, v):
        rev = self.rt.revision
        changed = self.values[k] != v
        self.values[k] = v
        self.inputs[k].set(v)
        assert self.rt.revision == rev + (1 if changed else 0)

    @rule(changes=st.lists(st.tuples(st.integers(0, N_INPUTS - 1), st.integers(0, 6)),
                           min_size=1, max_size=4))
    def batch(self, changes):
        rev = self.rt.revision
        before = list(self.values)
        with self.rt.batch():
            for k, v in changes:
                self.values[k] = v
                self.inputs[k].set(v)
        # one revision for the whole batch if anything differs at any point of it
        assert self.rt.revision - rev in (0, 1)
        if self.values != before:
            assert self.rt.revision == rev + 1

    @rule(data=st.data())
    def demand(self, data):
        i = data.draw(st.integers(0, len(self.cells) - 1))
        arg = data.draw(st.sampled_from([0, 1]))
        self.ran.clear()
        got = self.engine(i, arg)
        assert got == self.scratch(i, arg), (i, arg)
        assert all(c == 1 for c in self.ran.values()), f"ran more than once: {self.ran}"
        # demanding again with nothing changed runs nothing
        self.ran.clear()
        assert self.engine(i, arg) == got or got[0] == "err"
        if got[0] == "ok":
            assert not self.ran, f"ran with nothing changed: {self.ran}"

    @rule(data=st.data())
    def observe(self, data):
        i = data.draw(st.integers(0, len(self.cells) - 1))
        arg = data.draw(st.sampled_from([0, 1]))
        if (i, arg) in self.observers:
            return
        try:
            self.observers[(i, arg)] = self.rt.observe(self.cells[i], arg)
        except Boom:
            assert self.scratch(i, arg)[0] == "err"

    @precondition(lambda self: bool(self.observers))
    @rule(data=st.data())
    def unobserve(self, data):
        key = data.draw(st.sampled_from(sorted(self.observers)))
        self.observers.pop(key).stop()

    @rule()
    def stabilize(self):
        self.ran.clear()
        try:
            report = self.rt.stabilize()
        except Boom:
            report = None
        assert all(c == 1 for c in self.ran.values()), f"ran more than once: {self.ran}"
        if report is not None:
            assert len(report.recomputed) == sum(self.ran.values())
        # every observed instance is now up to date: reading one that succeeded runs nothing
        for (i, arg), obs in sorted(self.observers.items()):
            want = self.scratch(i, arg)
            self.ran.clear()
            try:
                got = ("ok", obs.value)
            except Boom:
                got = ("err", None)
            assert got == want, (i, arg)
            if want[0] == "ok":
                assert not self.ran, f"reading a stabilized observer ran {self.ran}"

    @invariant()
    def trace_is_consistent(self):
        if hasattr(self, "rt"):
            self.rt._check()


class StoreEngineVsScratch(EngineVsScratch):
    """The same machine on an LMDB store, with process restarts: a new runtime opens the
    store, declares the inputs with their current values and defines the same cells; whatever
    it takes from the store must equal from-scratch evaluation."""

    def new_runtime(self):
        if not hasattr(self, "path"):
            self.tmp = tempfile.TemporaryDirectory()
            self.path = os.path.join(self.tmp.name, "store")
        return incr.Runtime(store=self.path)

    def version_of(self, i, prog):
        return repr(sorted(prog.items()))  # an exact identity: the program is the definition

    @rule()
    def restart(self):
        for obs in self.observers.values():
            obs.stop()
        self.observers.clear()
        self.rt.close()
        self.rt = self.new_runtime()
        self.inputs[:] = [self.rt.input(f"x{k}", v) for k, v in enumerate(self.values)]
        self.cells[:] = [self._make_cell(i, prog) for i, prog in enumerate(self.progs)]
        self.ran.clear()
        for i in range(len(self.cells)):
            self.engine(i, 0)
        hits = self.rt.stats()["store_hits"]
        assert hits + sum(self.ran.values()) >= 1

    def teardown(self):
        if hasattr(self, "rt"):
            self.rt.close()
        if hasattr(self, "tmp"):
            self.tmp.cleanup()


EngineVsScratch.TestCase.settings = settings(
    max_examples=int(__import__("os").environ.get("INCR_SM_EXAMPLES", "300")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestEngineVsScratch = EngineVsScratch.TestCase

StoreEngineVsScratch.TestCase.settings = settings(
    max_examples=int(__import__("os").environ.get("INCR_SM_STORE_EXAMPLES", "60")),
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestStoreEngineVsScratch = StoreEngineVsScratch.TestCase
