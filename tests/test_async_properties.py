"""Concurrency and async against serial and from-scratch evaluation: a hypothesis state machine.

The graph is drawn once per example: three inputs and 4-8 nodes, each a sync cell, an
``async def`` cell, a sync ``@incr.llm`` node or an async ``@incr.llm`` node, each reading a
random subset of the inputs and of the earlier nodes:

- sync cells read their node dependencies with plain calls or with ``incr.gather``;
- async cells ``await`` them one by one or with ``asyncio.gather(..., return_exceptions=True)``
  (then raise the first failure in dependency order, so the outcome does not depend on which
  task finished first); a sync dependency is read with ``dep.aget()`` or, sometimes, with a
  plain call (which unwinds and redoes the body when the sync cell needs async work);
- an LLM node's generator and validator read the same dependencies and compute
  ``t = (sum + i) % mod``; the accepted candidate is ``want(t)``; the validator NACKs every
  other candidate. The generator first returns a "draft" (always NACKed, then it answers
  right) for some t, unless the counterexample for that t is already a regression case;
  for one "hopeless" t it never answers right (``NotAccepted``); for the "boom" t it raises
  ``Boom`` after its reads. Each model call ends with ``asyncio.sleep(0)`` / ``time.sleep(0)``.
- cells raise ``Boom`` when their value is their "boom" value.

Three runtimes see the same steps: (1) ``max_workers=4`` driven by ``rt.stabilize()``,
``await rt.astabilize()``, top-level ``await node()`` / ``node.aget()`` /
``asyncio.gather`` of several demands, and by ``astabilize()`` tasks cancelled at a random
point; (2) ``max_workers=1`` driven only by plain sync ``stabilize()`` and calls; (3) a
plain recursive evaluation of the graph from the inputs (pure Python, no incr).

After every step: ``rt._check()`` on (1) and (2); every observed value (or the type of its
error) agrees between (1), (2) and (3) (while halted, a node may instead fail with
``NotAccepted("halted")``); NotAccepted reasons, node states, what stabilize recomputed and
the model calls (generator calls past their reads, validator calls) agree between (1) and
(2). A cancelled ``astabilize()`` on (1) is a step (2) does not take (cancellation records
nothing); the model calls it made count as an allowance: from then on (1) may have made more
calls than (2) per node, by at most the calls completed or cancelled inside cancelled passes,
never fewer. Every call started was completed or cancelled (none left running).

Sized for CI: INCR_PROPERTY_EXAMPLES (default 40) examples of up to INCR_PROPERTY_STEPS
(default 20) steps; failures are not shrunk unless INCR_PROPERTY_SHRINK=1 (shrinking can outlast
the 300 s watchdog of conftest.py). INCR_ASYNC_IGNORE (below) skips known bugs. The plain tests
at the end of the file are minimal reproductions of the bugs the machine found.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from collections import Counter

import pytest
import hypothesis.strategies as st
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import incr
from incr.errors import NotAccepted

N_INPUTS = 3
KINDS = ("sync", "async", "llm", "allm")
MAX_ATTEMPTS = 3
# INCR_ASYNC_IGNORE="await-in-generator,stabilize-outside-with,read-in-child-task,
# generator-error-spends-budget,gather-in-generator" stops
# exercising the known bugs that the plain tests at the end of this file reproduce (async
# generators and validators then read async dependencies with `await dep.aget()` only;
# stabilize()/astabilize() run inside `with rt:`; a sync dependency read under asyncio.gather is
# read with aget(), not by a plain call in a child task; LLM generators never raise; sync
# generators and validators read with plain calls, not incr.gather), so that a run can look for others. By
# default everything is exercised.
KNOWN_BUGS = set(os.environ.get("INCR_ASYNC_IGNORE", "").split(","))


class Boom(Exception):
    pass


def _active(rt, fn):
    """``fn()`` -- a stabilize -- as the API shows it, on no active runtime; inside ``with rt:``
    when the known bug test_observed_async_cell_awaiting_an_async_node_outside_with
    reproduces is ignored (INCR_ASYNC_IGNORE=stabilize-outside-with)."""
    if "stabilize-outside-with" not in KNOWN_BUGS:
        return fn()
    with rt:
        return fn()


def want(t):
    return (t * 5 + 1) % 9


# -- the graph --------------------------------------------------------------------------------


@st.composite
def graphs(draw):
    n = draw(st.integers(4, 8))
    nodes = []
    for i in range(n):
        pool = [("in", k) for k in range(N_INPUTS)] + [("node", j) for j in range(i)]
        nodes.append({
            "kind": draw(st.sampled_from(KINDS)),
            "deps": draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3, unique=True)),
            "mod": draw(st.sampled_from([3, 4, 5, 7])),
            "boom": draw(st.sampled_from([None, None, 0, 2])),
            "hopeless": draw(st.sampled_from([None, None, 1, 3])),
            "draft": draw(st.sampled_from([None, 0, 1])),      # t % 2 == draft: draft first
            "gather": draw(st.booleans()),      # incr.gather / asyncio.gather, else one by one
            "plain_sync": draw(st.booleans()),  # async bodies read sync deps with a plain call
            "avalid": draw(st.booleans()),      # an async LLM node's validator is async
            "acall": draw(st.booleans()),       # an async generator/validator reads an async
                                                # dependency with `await dep()`, else aget()
        })
    return nodes


def scratch(spec, values):
    """The graph evaluated from the inputs in plain Python: node -> ("ok", v) | ("err", type)."""
    out = []
    for i, p in enumerate(spec):
        total, err = 0, None
        for kind, j in p["deps"]:
            if kind == "in":
                total += values[j]
            elif out[j][0] == "err":
                err = out[j]
                break
            else:
                total += out[j][1]
        if err is not None:
            out.append(err)
            continue
        t = (total + i) % p["mod"]
        if p["kind"] in ("sync", "async"):
            out.append(("err", "Boom") if t == p["boom"] else ("ok", t))
        elif t == p["boom"] and "generator-error-spends-budget" not in KNOWN_BUGS:
            out.append(("err", "Boom"))
        elif t == p["hopeless"]:
            out.append(("err", "NotAccepted"))
        else:
            out.append(("ok", want(t)))
    return out


class Graph:
    """One runtime with the graph built on it, and what its model calls did."""

    def __init__(self, spec, values, workers):
        self.spec = spec
        rt = self.rt = incr.Runtime(max_workers=workers)
        self.inputs = [rt.input(f"x{k}", v) for k, v in enumerate(values)]
        self.lock = threading.Lock()
        self.gens = Counter()          # generator calls that got past their reads (completed)
        self.gen_started = Counter()
        self.gen_cancelled = Counter()
        self.vals = Counter()          # validator calls that got past their reads
        self.val_started = Counter()
        self.val_cancelled = Counter()
        self.nodes = []
        self.observers = {}            # node index -> Observer
        self.ahead = set()             # nodes an incr.gather that raised had demanded
        self.changes = {}              # node index -> values passed to its callback
        for i, p in enumerate(spec):
            self.nodes.append(self._make(i, p))

    def count(self, counter, i):
        with self.lock:
            counter[i] += 1

    # reading dependencies, the five ways
    def _read_sync(self, p, in_llm=False):
        deps = [(lambda j=j: self.inputs[j].get()) if k == "in" else (lambda j=j: self.nodes[j]())
                for k, j in p["deps"]]
        if in_llm and "gather-in-generator" in KNOWN_BUGS:
            return sum(d() for d in deps)
        if p["gather"] and any(k == "node" for k, _ in p["deps"]):
            try:
                return sum(incr.gather(*deps))
            except Exception:
                # the other demands of the gather may have run (concurrently) or not (one
                # by one, stopping at the first error): AsyncVsSerial._catch_up
                self.ahead.update(j for k, j in p["deps"] if k == "node")
                raise
        return sum(d() for d in deps)

    async def _read_async(self, p, in_llm=False):
        def aw(j):
            if self.spec[j]["kind"] in ("async", "allm"):
                if in_llm and (not p["acall"] or "await-in-generator" in KNOWN_BUGS):
                    return self.nodes[j].aget()
                return self.nodes[j]()
            if p["plain_sync"] and not (p["gather"] and "read-in-child-task" in KNOWN_BUGS):
                # under asyncio.gather this coroutine runs as a task of its own
                async def plain():
                    return self.nodes[j]()
                return plain()
            return self.nodes[j].aget()
        if p["gather"]:
            got = await asyncio.gather(
                *[aw(j) for k, j in p["deps"] if k == "node"], return_exceptions=True)
            it = iter(got)
            total = 0
            for k, j in p["deps"]:
                if k == "in":
                    total += self.inputs[j].get()
                else:
                    v = next(it)
                    if isinstance(v, BaseException):
                        raise v
                    total += v
            return total
        total = 0
        for k, j in p["deps"]:
            total += self.inputs[j].get() if k == "in" else await aw(j)
        return total

    def _make(self, i, p):
        name = f"n{i}"
        g = self

        if p["kind"] == "sync":
            def body():
                t = (g._read_sync(p) + i) % p["mod"]
                if t == p["boom"]:
                    raise Boom(name)
                return t
            body.__name__ = body.__qualname__ = name
            return incr.cell(body)

        if p["kind"] == "async":
            async def abody():
                t = (await g._read_async(p) + i) % p["mod"]
                if t == p["boom"]:
                    raise Boom(name)
                return t
            abody.__name__ = abody.__qualname__ = name
            return incr.cell(abody)

        def answer(t, feedback):
            if t == p["boom"] and "generator-error-spends-budget" not in KNOWN_BUGS:
                raise Boom(name)
            if t == p["hopeless"]:
                return 5000 + 10 * len(feedback) + t
            known = any(f.counterexample == ["want", t] or f.counterexample == ("want", t)
                        for f in feedback)
            if p["draft"] is not None and t % 2 == p["draft"] and not known:
                return 1000 + t
            return want(t)

        def verdict(cand, t):
            if cand == want(t):
                return incr.ACK("right")
            return incr.NACK("right", counterexample=("want", t))

        if p["kind"] == "llm":
            def gen(*, previous=None, feedback=()):
                t = (g._read_sync(p, True) + i) % p["mod"]
                out = answer(t, feedback)
                g.count(g.gen_started, i)
                time.sleep(0)                       # the model call
                g.count(g.gens, i)
                return out

            def check(cand):
                try:
                    t = (g._read_sync(p, True) + i) % p["mod"]
                except (Boom, NotAccepted):
                    return incr.NACK("right", counterexample=("dep",))
                g.count(g.val_started, i)
                g.count(g.vals, i)
                return verdict(cand, t)
        else:
            async def gen(*, previous=None, feedback=()):
                t = (await g._read_async(p, True) + i) % p["mod"]
                out = answer(t, feedback)
                g.count(g.gen_started, i)
                try:
                    await asyncio.sleep(0)          # the model call
                except asyncio.CancelledError:
                    g.count(g.gen_cancelled, i)
                    raise
                g.count(g.gens, i)
                return out

            if p["avalid"]:
                async def check(cand):
                    try:
                        t = (await g._read_async(p, True) + i) % p["mod"]
                    except (Boom, NotAccepted):
                        return incr.NACK("right", counterexample=("dep",))
                    g.count(g.val_started, i)
                    try:
                        await asyncio.sleep(0)
                    except asyncio.CancelledError:
                        g.count(g.val_cancelled, i)
                        raise
                    g.count(g.vals, i)
                    return verdict(cand, t)
            else:
                def check(cand):
                    try:
                        t = (g._read_sync(p, True) + i) % p["mod"]
                    except (Boom, NotAccepted):
                        return incr.NACK("right", counterexample=("dep",))
                    g.count(g.val_started, i)
                    g.count(g.vals, i)
                    return verdict(cand, t)
        gen.__name__ = gen.__qualname__ = name
        check.__name__ = check.__qualname__ = f"{name}_check"
        return incr.llm(gen, validators=[incr.validator(check, version="1")], version=name,
                        budget=incr.Budget(max_attempts=MAX_ATTEMPTS))

    # -- reading outcomes ----------------------------------------------------------------------

    @staticmethod
    def outcome_of(exc, value=None):
        if exc is None:
            return ("ok", value)
        if isinstance(exc, NotAccepted):
            return ("err", "NotAccepted", exc.reason)
        return ("err", type(exc).__name__)

    def observed(self):
        out = {}
        for i, o in sorted(self.observers.items()):
            err = o.error
            out[i] = self.outcome_of(err) if err is not None else ("ok", o.value)
        return out

    def state(self, i):
        if self.spec[i]["kind"] not in ("llm", "allm"):
            return None
        try:
            s = self.rt.state(self.nodes[i])
        except incr.IncrError:
            return None
        return (s.status, s.revision, s.candidate)

    def states(self):
        return {i: self.state(i) for i in range(len(self.spec))}


def _strip(outcome):
    """The part of an outcome the from-scratch model knows (not NotAccepted's reason)."""
    return outcome[:2]


# -- the machine --------------------------------------------------------------------------------


class AsyncVsSerial(RuleBasedStateMachine):

    @initialize(spec=graphs(), values=st.lists(st.integers(0, 4), min_size=N_INPUTS,
                                               max_size=N_INPUTS))
    def build(self, spec, values):
        self.spec = spec
        self.values = list(values)
        self.conc = Graph(spec, values, 4)
        self.serial = Graph(spec, values, 1)
        self.allow_gen = Counter()        # calls (1) made in cancelled passes, per node
        self.allow_val = Counter()
        self.cancelled_once = False
        self.halted = False
        self.clean = False                # the last step was a stabilize that left all ok

    def _both(self, fn):
        return fn(self.conc), fn(self.serial)

    def _same(self, what, a, b):
        assert a == b, f"{what}: concurrent {a!r}, serial {b!r}\nspec={self.spec!r}"

    def _vs_scratch(self, what, got: dict):
        want_ = scratch(self.spec, self.values)
        for i, out in got.items():
            if self.halted and out[:3] == ("err", "NotAccepted", "halted"):
                continue
            assert _strip(out) == want_[i], (
                f"{what}: n{i} is {out!r}, from scratch {want_[i]!r}; inputs {self.values}"
                f"\nspec={self.spec!r}")

    # -- inputs ------------------------------------------------------------------------------

    @rule(k=st.integers(0, N_INPUTS - 1), v=st.integers(0, 4))
    def set_input(self, k, v):
        self.values[k] = v
        self._both(lambda g: g.inputs[k].set(v))
        self.clean = False

    @rule(vs=st.lists(st.integers(0, 4), min_size=N_INPUTS, max_size=N_INPUTS))
    def set_in_batch(self, vs):
        self.values = list(vs)

        def step(g):
            with g.rt.batch():
                for inp, v in zip(g.inputs, vs):
                    inp.set(v)
        self._both(step)
        self.clean = False

    # -- observers -----------------------------------------------------------------------------

    @rule(data=st.data())
    def observe(self, data):
        i = data.draw(st.integers(0, len(self.spec) - 1), label="observe")
        if i in self.conc.observers:
            return

        def step(g):
            obs = g.rt.observe(g.nodes[i])
            g.observers[i] = obs
            g.changes[i] = []
            obs.on_change(g.changes[i].append)
        self._both(step)
        self.clean = False

    @rule(data=st.data())
    def unobserve(self, data):
        if not self.conc.observers:
            return
        i = data.draw(st.sampled_from(sorted(self.conc.observers)), label="unobserve")

        def step(g):
            g.observers.pop(i).stop()
            g.changes.pop(i)
        self._both(step)

    # -- halting ---------------------------------------------------------------------------------

    @rule()
    def halt(self):
        self._both(lambda g: g.rt.halt("operator"))
        self.halted = True
        self.clean = False

    @rule()
    def resume(self):
        self._both(lambda g: g.rt.resume())
        self.halted = False
        self.clean = False

    # -- stabilizing -------------------------------------------------------------------------

    def _stabilize_serial(self):
        return self._stab(self.serial, lambda: _active(self.serial.rt, self.serial.rt.stabilize))

    @staticmethod
    def _stab(g, fn):
        before = (Counter(g.gens), Counter(g.vals))
        try:
            report = fn()
            raised = None
        except BaseException as e:    # noqa: BLE001 -- compared below
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            report, raised = None, e
        calls = (g.gens - before[0], g.vals - before[1])
        return report, raised, calls

    def _after_stabilize(self, what, rc, rs):
        (rep_c, exc_c, calls_c), (rep_s, exc_s, calls_s) = rc, rs
        obs_c, obs_s = self.conc.observed(), self.serial.observed()
        self._same(f"{what}: observed", obs_c, obs_s)
        self._vs_scratch(what, obs_c)
        for g, exc, obs in ((self.conc, exc_c, obs_c), (self.serial, exc_s, obs_s)):
            if exc is None:
                assert all(o[0] == "ok" for o in obs.values()), (what, obs)
            else:
                # stabilize raises one of the observed instances' errors
                assert not isinstance(exc, AssertionError), exc
                kinds = {o[1] for o in obs.values() if o[0] == "err"}
                name = type(exc).__name__
                if name not in kinds and not isinstance(exc, BaseExceptionGroup):
                    raise AssertionError(f"{what}: stabilize raised {exc!r}, observed {obs}")
            # the last value passed to a callback is the current value (an instance that
            # already had its value when observed gets no callback until it changes)
            for i, o in obs.items():
                if o[0] == "ok" and g.changes[i]:
                    assert g.changes[i][-1] == o[1], (
                        f"{what}: n{i} is {o[1]!r}, its callbacks got {g.changes[i]!r}")
        if rep_c is not None and rep_s is not None and not (self.conc.ahead or
                                                            self.serial.ahead):
            # (an incr.gather that raised in this pass: what else it ran differs, _catch_up)
            if not self.cancelled_once:
                self._same(f"{what}: recomputed", sorted(rep_c.recomputed),
                           sorted(rep_s.recomputed))
                self._same(f"{what}: cut off", sorted(rep_c.cutoff), sorted(rep_s.cutoff))
            else:
                # the runs a cancelled pass finished are kept: (1) may have less to do
                # than (2), never more
                extra = Counter(rep_c.recomputed) - Counter(rep_s.recomputed)
                assert not extra, (f"{what}: recomputed {sorted(rep_c.recomputed)} by (1), "
                                   f"only {sorted(rep_s.recomputed)} by (2)")
        if self.clean:
            # nothing changed since a stabilize that left everything up to date
            for rep, calls in ((rep_c, calls_c), (rep_s, calls_s)):
                assert rep is not None and rep.recomputed == [], (what, rep and rep.recomputed)
                assert not calls[0] and not calls[1], (what, calls)
        self.clean = exc_c is None and exc_s is None and not self.halted
        if not self.cancelled_once:
            self._same(f"{what}: callbacks", self.conc.changes, self.serial.changes)

    @rule()
    def stabilize_sync(self):
        rc = self._stab(self.conc, lambda: _active(self.conc.rt, self.conc.rt.stabilize))
        self._after_stabilize("stabilize()", rc, self._stabilize_serial())

    @rule()
    def astabilize(self):
        async def main():
            return await _active(self.conc.rt, self.conc.rt.astabilize)
        rc = self._stab(self.conc, lambda: asyncio.run(main()))
        self._after_stabilize("astabilize()", rc, self._stabilize_serial())

    @rule(k=st.integers(0, 6), how=st.sampled_from(["cancel", "wait_for"]))
    def cancelled_astabilize(self, k, how):
        g = self.conc
        before = (Counter(g.gen_started), Counter(g.val_started))
        box = {}

        async def main():
            task = asyncio.ensure_future(_active(g.rt, g.rt.astabilize))
            if how == "wait_for":
                try:
                    # timeout=0: cancelled before its first step (a real timeout would make
                    # the example depend on the machine's speed)
                    box["report"] = await asyncio.wait_for(task, timeout=0)
                except asyncio.TimeoutError:
                    box["cancelled"] = True
                return
            for _ in range(k):
                await asyncio.sleep(0)
            if task.done():
                box["report"] = task.result()
                return
            task.cancel()
            try:
                box["report"] = await task
            except asyncio.CancelledError:
                box["cancelled"] = True

        rc = self._stab(g, lambda: asyncio.run(main()))
        rc = (box.get("report"),) + rc[1:]
        if not box.get("cancelled"):
            # it finished before the cancellation: an ordinary pass, taken by both
            self._after_stabilize("astabilize() (not cancelled)", rc, self._stabilize_serial())
            return
        self.cancelled_once = True
        self.clean = False
        self.allow_gen += g.gen_started - before[0]
        self.allow_val += g.val_started - before[1]
        assert rc[1] is None or isinstance(rc[1], asyncio.CancelledError), rc[1]

    # -- top-level demands ---------------------------------------------------------------------

    def _demand_serial(self, idx):
        g = self.serial
        out = {}
        with g.rt:
            for i in idx:
                try:
                    out[i] = ("ok", g.nodes[i]())
                except Exception as e:    # noqa: BLE001
                    out[i] = g.outcome_of(e)
        return out

    def _compare_demand(self, what, got_c, got_s):
        self._same(what, got_c, got_s)
        self._vs_scratch(what, got_c)
        self.clean = False

    @rule(data=st.data(), how=st.sampled_from(["await", "aget", "sync", "incr.gather"]))
    def demand(self, data, how):
        i = data.draw(st.integers(0, len(self.spec) - 1), label="demand")
        g = self.conc
        node = g.nodes[i]
        awaitable = self.spec[i]["kind"] in ("async", "allm")

        async def main():
            with g.rt:
                return await (node() if how == "await" and awaitable else node.aget())

        def run():
            if how in ("await", "aget"):
                return asyncio.run(main())
            with g.rt:
                if how == "sync":
                    return node()
                return incr.gather(lambda: node())[0]
        try:
            got = ("ok", run())
        except Exception as e:    # noqa: BLE001
            got = g.outcome_of(e)
        self._compare_demand(f"demand n{i} ({how})", {i: got}, self._demand_serial([i]))

    @rule(idx=st.lists(st.integers(0, 7), min_size=2, max_size=4, unique=True))
    def demand_together(self, idx):
        idx = [i for i in idx if i < len(self.spec)]
        g = self.conc

        async def main():
            with g.rt:
                return await asyncio.gather(*[g.nodes[i].aget() for i in idx],
                                            return_exceptions=True)
        got = asyncio.run(main())
        out = {}
        for i, v in zip(idx, got):
            out[i] = g.outcome_of(v) if isinstance(v, BaseException) else ("ok", v)
        self._compare_demand(f"asyncio.gather of {idx}", out, self._demand_serial(idx))

    # -- after every step ----------------------------------------------------------------------

    def _catch_up(self):
        """An ``incr.gather`` that raised demanded several instances: with ``max_workers=4``
        they run at once, so the others are computed (their model calls made) although the
        gather raised; with ``max_workers=1`` they run one by one and the gather stops at the
        first error. Both are right; so that the runtimes stay comparable, both then demand
        every instance such a gather named (the serial one computes what the concurrent one
        already did), and the pass's own ``recomputed`` is not compared."""
        idx = self.conc.ahead | self.serial.ahead
        self.conc.ahead.clear()
        self.serial.ahead.clear()
        if not idx:
            return
        self.clean = False
        for g in (self.conc, self.serial):
            with g.rt:
                for i in sorted(idx):
                    try:
                        g.nodes[i]()
                    except Exception:    # noqa: BLE001 -- the same in both; compared later
                        pass

    @invariant()
    def consistent(self):
        if not hasattr(self, "conc"):
            return
        self._catch_up()
        self.conc.rt._check()
        self.serial.rt._check()
        c, s = self.conc, self.serial
        # every call started was completed or cancelled: none is left running
        for started, done, cancelled, what in (
                (c.gen_started, c.gens, c.gen_cancelled, "generator"),
                (c.val_started, c.vals, c.val_cancelled, "validator")):
            assert started == done + cancelled, (what, started, done, cancelled)
        for what, mine, ref, allow in (("generator calls", c.gens, s.gens, self.allow_gen),
                                       ("validator calls", c.vals, s.vals, self.allow_val)):
            for i in range(len(self.spec)):
                extra = mine[i] - ref[i]
                assert 0 <= extra <= allow[i], (
                    f"{what} of n{i}: concurrent {mine[i]}, serial {ref[i]}, "
                    f"cancelled passes started {allow[i]}\nspec={self.spec!r}")
        if not self.cancelled_once:
            self._same("node states", c.states(), s.states())


AsyncVsSerial.TestCase.settings = settings(
    max_examples=int(os.environ.get("INCR_PROPERTY_EXAMPLES", "40")),
    stateful_step_count=int(os.environ.get("INCR_PROPERTY_STEPS", "20")),
    deadline=None,
    # shrinking a failure of this machine can outlast conftest's 300 s watchdog: opt in
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
    + ([Phase.shrink] if os.environ.get("INCR_PROPERTY_SHRINK") == "1" else []),
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                           HealthCheck.data_too_large],
    # CI runs a fixed sequence of examples: an open bug this machine may still find now and
    # then (seed 61 at 300 examples hangs in a pass, see below) must not turn a landing red by
    # chance; local runs stay random
    derandomize=os.environ.get("CI") == "true",
)
TestAsyncVsSerial = AsyncVsSerial.TestCase


# -- minimal reproductions of the bugs the machine found ----------------------------------------
#
# Each fails on the commit it was written against (d56be9a; those from
# test_sync_call_of_an_async_cell_whose_first_step_needs_async_work_of_a_sync_read on: f9c5035);
# the machine above exercises the same paths by default (INCR_ASYNC_IGNORE turns some off to
# look for other bugs). With them fixed the machine passes at 200 examples for seeds 1-12 and
# 30-35 but 32 (INCR_PROPERTY_EXAMPLES=200 ... --hypothesis-seed=N), and at 400 for seeds 20-23.
# Seed 32 found a halt bug that is not async (sync demands show it too), fixed since:
# test_an_llm_node_demanded_while_halted_is_recomputed_after_resume below. After that fix,
# at 300 examples seeds 1-3, 32, 40, 41, 50-58 and 60-65 pass but 2 (the worker's async-cell
# call: test_a_gather_thunk_in_a_worker_calling_an_async_cell_..., fixed since) and 61,
# which hung inside a stabilize() driven by astabilize (test_seed61_program_ends, fixed
# since). With run-ahead rounds detached inside astabilize (issue 11), seeds 1-12, 32, 40,
# 41, 50-53, 55, 60-65 pass at 150-300 examples; the "gather after halt: Boom vs 1" case
# reported as flaky did not show in them.


def test_await_of_an_async_node_inside_an_async_generator():
    """An async generator that reads another async LLM node (or async cell) with
    ``await node()`` -- the way an async cell reads it -- gets the plain value back
    (``TypeError: object int can't be used in 'await' expression``) for an LLM node, and
    ``IncrError: ... in flight with nobody to finish it (an internal error)`` for an async
    cell; from sync code, ``IncrError: ... sync code running inside an event loop``.
    ``await node.aget()`` works, and so does the same generator under stabilize().
    Guess: ``_aio.call`` treats a call as async code only when the innermost frame is an
    ``async def`` *cell*; the pseudo-frame of an async generator/validator call (``Call.do``)
    belongs to the LLM node, whose cell is not ``is_async``, so the call demands
    synchronously inside the running loop."""
    rt = incr.Runtime()
    x = rt.input("x", 1)

    @incr.llm(version="a")
    async def a(*, previous=None, feedback=()):
        v = x.get()
        await asyncio.sleep(0)
        return v

    @incr.llm(version="b")
    async def b(*, previous=None, feedback=()):
        v = await a()
        await asyncio.sleep(0)
        return v + 1

    async def main():
        with rt:
            return await b()

    assert asyncio.run(main()) == 2
    rt._check()


def test_await_of_an_async_cell_inside_an_async_generator():
    rt = incr.Runtime()
    x = rt.input("x", 1)

    @incr.cell
    async def c():
        await asyncio.sleep(0)
        return x.get()

    @incr.llm(version="b")
    async def b(*, previous=None, feedback=()):
        v = await c()
        await asyncio.sleep(0)
        return v + 1

    async def main():
        with rt:
            return await b.aget()

    assert asyncio.run(main()) == 2
    rt._check()


def test_observed_async_cell_awaiting_an_async_node_outside_with():
    """The first stabilize() (or astabilize()) of an observed async cell that awaits an async
    LLM node fails with ``AttributeError: 'NoneType' object has no attribute 'label_text'``
    (llmnodes._node_of) -- unless the call is made inside ``with rt:``. A warm instance
    (computed before) is fine. Guess: the LLM loop takes its runtime from ``incr.current()``
    (``_Loop.__init__``), and the task that resumes the async cell's run does not have ``rt``
    as the active runtime when stabilize() is called outside ``with rt:``, so the loop looks
    at the default runtime, whose running stack is empty."""
    for how in ("stabilize", "astabilize"):
        rt = incr.Runtime()

        @incr.llm(version="a")
        async def a(*, previous=None, feedback=()):
            await asyncio.sleep(0)
            return 1

        @incr.cell
        async def c():
            return await a()

        obs = rt.observe(c)
        if how == "stabilize":
            rt.stabilize()
        else:
            async def main():
                await rt.astabilize()
            asyncio.run(main())
        assert obs.error is None and obs.value == 1, (how, obs.error)
        rt._check()


def test_a_read_in_a_child_task_of_an_async_cell_is_a_dependency():
    """An async cell that reads an input (or calls a sync cell) in a coroutine it runs under
    ``asyncio.gather`` (a task of its own) does not record the read: after the input changes
    the cell keeps its old value for ever, with no error. Reading the same coroutine with a
    plain ``await`` (same task) is tracked. Guess: the running frame stack is swapped in by
    ``_Stepper`` only around the steps of the cell's own coroutine; a child task steps outside
    it, so its reads land on the (empty) top-level stack and are taken as untracked top-level
    reads. (Recording them, or refusing them with an error, would both be sound; silently
    dropping them is not.)"""
    rt = incr.Runtime()
    x = rt.input("x", 1)

    @incr.cell
    def s():
        return x.get()

    async def read_input():
        return x.get()

    async def read_cell():
        return s()

    @incr.cell
    async def c1():
        return (await asyncio.gather(read_input()))[0]

    @incr.cell
    async def c2():
        return (await asyncio.gather(read_cell()))[0]

    async def main():
        with rt:
            assert (await c1(), await c2()) == (1, 1)
            x.set(2)
            return await c1(), await c2()

    assert asyncio.run(main()) == (2, 2)
    rt._check()


def test_a_callback_gets_the_value_of_an_instance_observed_warm():
    """Spec question rather than a crash: the commit that made observe lazy says "Callbacks
    get every value the observer has not passed on, the first one included", and an observer
    of a cold instance does get its first value at the next stabilize(). An observer of an
    instance that was already computed (a top-level demand before rt.observe) never gets it:
    its callbacks stay silent until the value changes -- in both max_workers=1 and 4, sync and
    async. Either the callback should get the current value at the first stabilize, or the
    docs should say that only a computation after observe is passed on."""
    rt = incr.Runtime()
    x = rt.input("x", 0)

    @incr.cell
    def n0():
        return x.get()

    with rt:
        n0()
    obs = rt.observe(n0)
    seen = []
    obs.on_change(seen.append)
    rt.stabilize()
    assert obs.value == 0
    assert seen == [0]


def test_a_generator_error_is_raised_again_at_every_demand():
    """Found as a difference between the runtimes: the same graph and the same steps, where
    one runtime demanded a failing node a few more times (separate top-level demands rather
    than one asyncio.gather), ends with ``NotAccepted("budget")`` where the other (and the
    from-scratch model) raise the generator's ``Boom``. A generator exception that is not a
    transport error "propagates as a cell's does" (api.md), and a failed cell "runs again at
    its next demand"; here every separate demand spends an attempt of the budget, and after
    ``max_attempts`` demands the node stops calling the generator and turns the error into
    ``NotAccepted(reason="budget")`` -- so the error a caller sees depends on how many
    times the node was asked before, not on the inputs. Possibly intended (the budget caps
    generator calls); then api.md should say so. Guess: _Loop counts the raising call in
    ``spent_attempts`` and the budget window is not reopened because nothing it read changed."""
    rt = incr.Runtime(max_workers=1)

    @incr.llm(version="a", budget=incr.Budget(max_attempts=3))
    def a(*, previous=None, feedback=()):
        raise Boom("a")

    seen = []
    with rt:
        for _ in range(4):
            try:
                a()
            except Exception as e:    # noqa: BLE001
                seen.append(type(e).__name__)
    rt._check()
    assert seen == ["Boom"] * 4, seen


def test_incr_gather_inside_a_generator_run_ahead_by_a_top_level_gather():
    """With ``max_workers`` > 1, a top-level ``incr.gather(lambda: b())`` of a sync LLM node
    whose generator itself reads with ``incr.gather`` raises ``IncrError: this incr.Runtime is
    computing in another thread``; ``b()`` alone, or ``max_workers=1``, give the value. Guess:
    the top-level gather runs b's generator ahead in a worker thread, and the nested
    ``incr.gather`` there does not see that it is inside a worker (it claims the runtime as a
    top-level gather, or starts rounds of its own) instead of logging its reads as a worker's
    other reads are."""
    rt = incr.Runtime(max_workers=4)
    x = rt.input("x", 1)

    @incr.cell
    def c():
        return x.get()

    @incr.llm(version="b")
    def b(*, previous=None, feedback=()):
        return incr.gather(lambda: c())[0] + 1

    with rt:
        assert incr.gather(lambda: b()) == [2]
    rt._check()


def test_sync_call_of_an_async_cell_whose_first_step_needs_async_work_of_a_sync_read():
    """Found by the machine at 200 examples (seed 4): a plain sync call of an async cell, with
    no loop running, whose body reads a sync cell that needs async work (here an async LLM
    node's generator call) raises ``IncrError: ... sync code running inside an event loop
    cannot wait for it``, while ``await c()`` (and ``rt.stabilize()`` of an observed ``c``)
    give the value. The contract: sync code that calls an async cell gets its value. The
    cause: the first step of the async cell's body is taken in place (``run_async``,
    incr/_core_async.pxi), with this thread's own loop set as the running loop, so the sync
    cell inside unwinds for the async work (``_Suspend``) as it would in async code, and
    nothing on the sync demand's path takes that work."""
    rt = incr.Runtime(max_workers=1)
    x = rt.input("x", 1)
    calls = Counter()

    @incr.llm(version="a")
    async def a(*, previous=None, feedback=()):
        v = x.get()
        calls["a"] += 1
        await asyncio.sleep(0)
        return v

    @incr.cell
    def s():
        calls["s"] += 1
        return a() + 1

    @incr.cell
    async def c():
        calls["c"] += 1
        return s() + 1

    with rt:
        assert c() == 3
        assert calls["a"] == 1
        x.set(5)
        assert c() == 7
        assert calls["a"] == 2
    rt._check()


@pytest.mark.parametrize("how", ["sync", "await"])
@pytest.mark.parametrize("where", ["generator", "validator"])
def test_sync_call_of_an_async_llm_node_whose_call_reads_a_sync_cell_needing_async_work(
        where, how):
    """Found by the machine at 200 examples (seed 4, after the fix above): a sync demand of an
    async LLM node whose async generator (or async validator) reads, with a plain call, a
    sync cell that needs async work raised ``IncrError: ... sync code running inside an event
    loop``; ``await b()`` gives the value. The call runs on this thread's own loop
    (``_aio.drive_call``), where the sync cell unwinds for the work as in async code; the
    call is now that unwinding's restart point: the work is done, the call made again.
    Under ``await`` the async validator's call made ``a``'s model call twice on a cold run
    (the unwinding was kept as the call's outcome and replayed by ``b``'s loop after ``a``
    had been computed); the call (``_aio.Call``) is now a restart point too."""
    rt = incr.Runtime(max_workers=1)
    x = rt.input("x", 1)
    calls = Counter()

    @incr.llm(version="a")
    async def a(*, previous=None, feedback=()):
        v = x.get()
        calls["a"] += 1
        await asyncio.sleep(0)
        return v

    @incr.cell
    def s():
        return a() + 1

    async def read_s():
        return s()

    @incr.validator(version="1")
    async def check(cand):
        want = await read_s() + 1
        calls["check"] += 1
        return incr.ACK("ok") if cand == want else incr.NACK("ok", counterexample=want)

    if where == "generator":
        @incr.llm(version="b")
        async def b(*, previous=None, feedback=()):
            v = await read_s() + 1
            calls["b"] += 1
            return v
    else:
        @incr.llm(version="b", validators=[check])
        async def b(*, previous=None, feedback=()):
            calls["b"] += 1
            return x.get() + 2

    async def both():
        assert await b() == 3
        x.set(4)
        assert await b() == 6

    with rt:
        if how == "await":
            asyncio.run(both())
        else:
            assert b() == 3
            x.set(4)
            assert b() == 6
    # the second run re-validates the old candidate first (NACKed), then the new one
    assert calls == ({"a": 2, "b": 2} if where == "generator" else
                     {"a": 2, "b": 2, "check": 3}), calls
    rt._check()


def test_sync_cell_needing_async_work_called_in_a_child_task_of_an_async_cell():
    """Found by the machine at 200 examples (seed 4): an async cell that reads a sync cell
    with a plain call in a coroutine it runs under ``asyncio.gather`` (a task of its own)
    raised ``IncrError: ... called from sync code in a task`` when the sync cell needed async
    work (an async LLM node's call); a sync ``c()`` gave the value. The unwinding now ends
    the child task and reaches the async cell's body through the gather; the body's run is
    the restart point (it runs again once the work is done)."""
    for how in ("sync", "await"):
        rt = incr.Runtime(max_workers=1)
        x = rt.input("x", 1)
        calls = Counter()

        @incr.llm(version="a")
        async def a(*, previous=None, feedback=()):
            v = x.get()
            calls["a"] += 1
            await asyncio.sleep(0)
            return v

        @incr.cell
        def s():
            return a() + 1

        async def plain():
            return s()

        @incr.cell
        async def c():
            got = await asyncio.gather(plain(), return_exceptions=True)
            if isinstance(got[0], BaseException):
                raise got[0]
            return got[0] + 1

        async def both():
            assert await c() == 3
            x.set(4)
            assert await c() == 6

        with rt:
            if how == "await":
                asyncio.run(both())
            else:
                assert c() == 3
                x.set(4)
                assert c() == 6
        assert calls == {"a": 2}, (how, calls)
        rt._check()


@pytest.mark.parametrize("how", ["astabilize", "stabilize"])
def test_an_observed_async_cell_reading_one_a_pass_suspended_first(how):
    """Found by the machine at 200 examples (seed 1): two observed async cells, ``n3`` reading
    ``n1``, and ``n1`` awaiting an async LLM node. The pass runs ``n1``'s first step, which
    waits (the model call) and unwinds to the pass's restart point; the pass goes on to
    ``n3``, whose first step awaits ``n1``, already in flight: ``IncrError: n1() is in
    flight with nobody to finish it (an internal error)``. The serial run gives the values.
    Whoever needs a run that unwound first now goes on with it (single flight)."""
    rt = incr.Runtime(max_workers=4)
    x = rt.input("x", 0)
    calls = Counter()

    @incr.llm(version="a")
    async def n0(*, previous=None, feedback=()):
        v = x.get()
        calls["n0"] += 1
        await asyncio.sleep(0)
        return v

    @incr.cell
    async def n1():
        calls["n1"] += 1
        return x.get() + await n0() + 1

    @incr.cell
    async def n3():
        calls["n3"] += 1
        return await n1() + 1

    o1, o3 = rt.observe(n1), rt.observe(n3)
    if how == "astabilize":
        async def main():
            return await rt.astabilize()
        asyncio.run(main())
    else:
        rt.stabilize()
    assert (o1.error, o3.error) == (None, None)
    assert (o1.value, o3.value) == (1, 2)
    assert calls["n0"] == 1, calls
    rt._check()


def test_a_sync_generator_unwound_at_a_read_spends_no_attempt():
    """Found by the machine at 200 examples (seed 4): a sync LLM node whose generator reads an
    async LLM node, demanded with ``await n5.aget()``, ended ``NotAccepted("budget")`` after
    two generator calls ("after 3 attempts"), where ``n5()`` from sync code ends
    ``NotAccepted("oscillation")`` after three. Inside a running loop the generator unwinds
    at its read (the async node must be computed first) and is called again: the unwound
    call was counted as an attempt of the budget. It is not one (the read waits in place in
    a serial run)."""
    outcomes = {}
    for how in ("sync", "await"):
        rt = incr.Runtime(max_workers=1)
        x = rt.input("x", 2)
        calls = Counter()

        @incr.llm(version="a")
        async def a(*, previous=None, feedback=()):
            v = x.get()
            await asyncio.sleep(0)
            return v

        @incr.validator(version="1")
        def check(cand):
            return incr.NACK("right", counterexample=("want", a()))

        @incr.llm(version="b", validators=[check], budget=incr.Budget(max_attempts=3))
        def b(*, previous=None, feedback=()):
            t = a()
            calls["b"] += 1
            return 5000 + 10 * len(feedback) + t

        with rt:
            try:
                if how == "await":
                    async def main():
                        return await b.aget()
                    asyncio.run(main())
                else:
                    b()
            except NotAccepted as e:
                outcomes[how] = (e.reason, calls["b"], len(rt.state(b).attempts))
        rt._check()
    assert outcomes["await"] == outcomes["sync"], outcomes
    assert outcomes["sync"][1] == 3, outcomes


@pytest.mark.parametrize("direct", [False, True])
def test_a_model_call_finished_for_one_waiter_is_not_made_again_for_another(direct):
    """Found by the machine at 200 examples (seed 5): ``asyncio.gather(n0.aget(),
    n3.aget())``, where the async cell ``n3`` reads ``n0`` through a sync cell in a child
    task, made ``n0``'s model call twice. The second waiter asked for the call after the
    first call had finished but before the first waiter had taken its outcome: nothing was
    in flight any more, so the call was made again. An outcome waiting to be taken is now
    the call done (single flight). With ``direct``, ``n3`` also awaits ``n0`` in the same
    gather (seed 5 again): the outcome had been taken and ``n0`` was up to date when the
    third waiter asked; a call for a node that is up to date is not made either."""
    rt = incr.Runtime(max_workers=4)
    x = rt.input("x", 0)
    calls = Counter()

    @incr.llm(version="a")
    async def n0(*, previous=None, feedback=()):
        v = x.get()
        calls["n0"] += 1
        await asyncio.sleep(0)
        return v

    @incr.cell
    def n2():
        return x.get() + n0()

    async def plain():
        return n2()

    @incr.cell
    async def n3():
        got = await asyncio.gather(*([n0()] if direct else []), plain(),
                                   return_exceptions=True)
        for g in got:
            if isinstance(g, BaseException):
                raise g
        return sum(got) + 1

    async def main():
        with rt:
            return await asyncio.gather(n0.aget(), n3.aget())

    assert asyncio.run(main()) == [0, 1]
    assert calls == {"n0": 1}, calls
    rt._check()


def test_an_observer_error_is_cleared_by_a_pass_that_stopped_for_async_work():
    """Found by the machine at 200 examples (seed 6): an observed sync cell failed (Boom) in
    one ``astabilize()``; its input changed back, and the next ``astabilize()`` -- whose
    first pass stopped for async work of another observed instance -- recomputed it
    successfully, yet ``Observer.error`` still held the old Boom (for good: later passes
    found it up to date). The pass that stops hands the callbacks of what it brought up to
    date to the next pass (``owe``); the observer's error is now cleared there too."""
    rt = incr.Runtime(max_workers=4)
    x = rt.input("x", 1)
    y = rt.input("y", 0)

    @incr.cell
    def n1():
        if x.get() == 1:
            raise Boom("n1")
        return x.get()

    @incr.cell
    def n0():
        return y.get()

    @incr.cell
    async def n6():
        return (await asyncio.gather(n0.aget()))[0]

    async def stab():
        await rt.astabilize()

    o1 = rt.observe(n1)
    with pytest.raises(Boom):
        asyncio.run(stab())
    assert isinstance(o1.error, Boom)
    o6 = rt.observe(n6)
    x.set(0)
    asyncio.run(stab())
    assert (o1.error, o6.error) == (None, None)
    assert (o1.value, o6.value) == (0, 0)
    rt._check()


def test_an_async_validator_that_reads_its_own_node_is_a_cycle_not_a_deadlock():
    """Found while fixing the above: an async validator that awaits its own node hung for ever
    under ``await b()`` (the validator's call waited for itself); ``b()`` from sync code ends
    ``NotAccepted("unknown")`` (the validator raised CycleError, which is UNKNOWN). Both now
    end the same way; the wait is bounded so that a regression fails instead of hanging."""
    outcomes = {}
    for how in ("sync", "await"):
        rt = incr.Runtime(max_workers=1)

        @incr.validator(version="1")
        async def check(cand):
            await b.aget()
            return incr.ACK("ok")

        @incr.llm(version="b", validators=[check])
        async def b(*, previous=None, feedback=()):
            await asyncio.sleep(0)
            return 3

        async def main():
            return await asyncio.wait_for(b(), 10)

        with rt:
            try:
                asyncio.run(main()) if how == "await" else b()
            except NotAccepted as e:
                outcomes[how] = e.reason
        rt._check()
    assert outcomes == {"sync": "unknown", "await": "unknown"}, outcomes


@pytest.mark.parametrize("how", ["sync", "await"])
def test_an_llm_node_demanded_while_halted_is_recomputed_after_resume(how):
    """Found by the machine (seed 32 at 200 examples), not async-specific. n1's run re-read
    n0, which failed halted; the loop then kept a snapshot of its reads holding the tick of
    that failure, as if it had looked at it. After rt.resume(), n0 ran again at that same
    tick (nothing had moved the clock), so n1 saw no change and served its old candidate
    (I7). Fixed twice over: an exception while re-reading keeps nothing (llmnodes._Loop.run),
    and resume() makes whatever met a halted node stale (Runtime._halt_lifted);
    tests/test_llm_halt.py covers the other readers (plain and async cells, stabilize,
    workers, a store)."""
    rt = incr.Runtime(max_workers=1)
    x = rt.input("x", 0)
    y = rt.input("y", 0)

    @incr.llm(version="a")
    def n0(*, previous=None, feedback=()):
        return y.get() * 5

    @incr.llm(version="b")
    def n1(*, previous=None, feedback=()):
        return x.get() + n0() + 100

    def get():
        with rt:
            if how == "sync":
                return n1()

            async def main():
                return await n1.aget()
            return asyncio.run(main())

    assert get() == 100
    rt.halt("operator")
    y.set(1)
    with pytest.raises(NotAccepted) as e:
        get()
    assert e.value.reason == "halted"
    rt.resume()
    assert get() == 105
    rt._check()


def test_an_interrupted_pass_leaves_no_work_it_started_marked_running():
    """A Ctrl-C in a pass that has set aside async work (mid's first step awaits leaf, whose
    task is created but has not started when syn raises): the pass drops mid's run, and
    leaf's task, left without a waiter, is cancelled -- but it was only settled when the loop
    next ran it, after the operation had ended, so leaf stayed marked running in between (I6;
    the debug build's finding, tests/test_attack_async.py finding5). Checked in the loop
    right after the interrupted astabilize(), before the loop runs again."""
    rt = incr.Runtime()
    interrupt = [True]
    ran = []

    @incr.cell
    async def leaf():
        ran.append("leaf")
        await asyncio.sleep(0)
        return 1

    @incr.cell
    async def mid():
        ran.append("mid")
        return await leaf() + 1

    @incr.cell
    def syn():
        ran.append("syn")
        if interrupt[0]:
            interrupt[0] = False
            raise KeyboardInterrupt
        return 5

    o1, o2 = rt.observe(mid), rt.observe(syn)

    async def main():
        with pytest.raises(KeyboardInterrupt):
            await rt.astabilize()
        rt._check()
        ran.clear()
        await rt.astabilize()
        rt._check()
        return o1.value, o2.value

    assert asyncio.run(main()) == (2, 5)
    assert sorted(ran) == ["leaf", "mid", "syn"]    # each once: nothing of the first pass kept
    rt._check()


def test_a_gather_thunk_in_a_worker_calling_an_async_cell_while_the_driver_is_in_an_async_call():
    """Found by the machine (seed 2 at 300 examples, about one run in three): a sync cell's
    incr.gather lends its second thunk to a worker thread (max_workers=2) while this thread
    runs the first -- an LLM node whose async validator is being called. The worker's call
    of an async cell looked at the runtime's frames, which are the driver's, saw the async
    call's frame on top, and returned a coroutine: TypeError "thunk 1 ... returned
    coroutine". Events make the two overlap every time."""
    rt = incr.Runtime(max_workers=2)
    x = rt.input("x", 1)
    started, done = threading.Event(), threading.Event()
    ran = []

    @incr.cell
    async def a():
        ran.append("a")
        await asyncio.sleep(0)
        return x.get() * 10

    @incr.validator(version="v")
    async def blocks(candidate):
        if not started.is_set():
            started.set()                  # the worker calls a() while this call runs
            assert done.wait(10)
        return incr.ACK("ok")

    @incr.llm(validators=[blocks], version="n")
    def node(*, previous=None, feedback=()):
        ran.append("node")
        return x.get()

    @incr.cell
    def both():
        def second():
            assert started.wait(10)
            try:
                return a()
            finally:
                done.set()
        return incr.gather(lambda: node(), second)

    with rt:
        assert both() == [1, 10]
    assert sorted(ran) == ["a", "node"]
    rt._check()


# Found by the machine at seed 61, 300 examples (main too): the program below, replayed step
# by step, never ends -- stabilize_pass loops on ahead_round (gdb: rounds = 4,783,015): from
# some round on, incr.remote.Ahead.run() has nothing set aside (returns False, so prefetch is
# stopped: "the next round is serial"), yet every round again finds something waiting to
# run ahead (a _Deferred or rt.ahead_marked), and nothing bounds the loop. (At the 2000th
# round rt._check() shows only the observed n6() -- a sync LLM node reading n4, n1 and an
# input -- stale and not queued, as mid-pass.) The cause (fixed): ensure() marked a reader
# F_AHEAD when its scan met a dependency running ahead, but listed it in rt.ahead_marked only
# when the scan ended; a later dependency's run that unwound for async work (_Suspend) left
# the mark unlisted, so no round or pass end cleared it, and every round of every later pass
# found the observed n6 still "running ahead" with nothing to run. It is now listed as it is
# marked (incr/_core_verify.pxi), and a second round in a row with nothing to run is an
# internal IncrError, never a loop (ahead_round, incr/_core_schedule.pxi). Run in a child with
# a time limit, so that a hang fails this test instead of ending the suite.
_SEED61 = """
import sys
sys.path.insert(0, "tests")
import test_async_properties as T


class D:
    def __init__(self, v):
        self.v = v

    def draw(self, strat, label=None):
        return self.v


state = T.AsyncVsSerial()
state.build(spec=[{'kind': 'sync',
  'deps': [('in', 1)],
  'mod': 7,
  'boom': 2,
  'hopeless': 3,
  'draft': None,
  'gather': True,
  'plain_sync': False,
  'avalid': True,
  'acall': True},
 {'kind': 'allm',
  'deps': [('node', 0)],
  'mod': 3,
  'boom': None,
  'hopeless': None,
  'draft': 0,
  'gather': True,
  'plain_sync': False,
  'avalid': True,
  'acall': False},
 {'kind': 'llm',
  'deps': [('in', 1), ('in', 2), ('node', 0)],
  'mod': 3,
  'boom': 2,
  'hopeless': None,
  'draft': 0,
  'gather': True,
  'plain_sync': False,
  'avalid': True,
  'acall': False},
 {'kind': 'llm',
  'deps': [('in', 1)],
  'mod': 3,
  'boom': None,
  'hopeless': 1,
  'draft': 1,
  'gather': True,
  'plain_sync': True,
  'avalid': True,
  'acall': False},
 {'kind': 'sync',
  'deps': [('node', 3), ('in', 1), ('node', 2)],
  'mod': 3,
  'boom': None,
  'hopeless': None,
  'draft': None,
  'gather': False,
  'plain_sync': True,
  'avalid': True,
  'acall': True},
 {'kind': 'async',
  'deps': [('in', 1)],
  'mod': 3,
  'boom': 0,
  'hopeless': 3,
  'draft': None,
  'gather': True,
  'plain_sync': False,
  'avalid': False,
  'acall': False},
 {'kind': 'llm',
  'deps': [('node', 4), ('node', 1), ('in', 0)],
  'mod': 7,
  'boom': 2,
  'hopeless': None,
  'draft': None,
  'gather': False,
  'plain_sync': True,
  'avalid': False,
  'acall': False},
 {'kind': 'allm',
  'deps': [('node', 5), ('node', 0), ('node', 6)],
  'mod': 5,
  'boom': None,
  'hopeless': None,
  'draft': 1,
  'gather': False,
  'plain_sync': True,
  'avalid': False,
  'acall': False}], values=[4, 0, 1])
state.consistent()
state.observe(data=D(6))
state.consistent()
state.observe(data=D(4))
state.consistent()
state.demand(data=D(3), how='await')
state.consistent()
state.set_input(k=2, v=2)
state.consistent()
state.observe(data=D(3))
state.consistent()
state.demand(data=D(6), how='await')
state.consistent()
state.demand(data=D(5), how='sync')
state.consistent()
state.stabilize_sync()
state.consistent()
state.set_input(k=1, v=3)
state.consistent()
state.set_input(k=0, v=1)
state.consistent()
state.set_input(k=0, v=0)
state.consistent()
state.demand(data=D(5), how='sync')
state.consistent()
state.stabilize_sync()
state.consistent()
print('DONE')
state.teardown()
"""


def test_seed61_program_ends(tmp_path):
    import subprocess
    import sys as _sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = tmp_path / "seed61.py"
    script.write_text(_SEED61)
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        done = subprocess.run([_sys.executable, str(script)], cwd=root, env=env,
                              capture_output=True, text=True, timeout=45)
    except subprocess.TimeoutExpired:
        raise AssertionError("the seed-61 program did not end in 45 s (the run-ahead "
                             "livelock)") from None
    assert done.returncode == 0 and "DONE" in done.stdout, done.stdout[-2000:] + \
        done.stderr[-2000:]
