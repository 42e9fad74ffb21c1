"""The five arms of the feedback benchmark, on one task at a time (internal).

Every arm spends through the same ``Ctx``: one meter of model calls, tokens and simulated
seconds per task, checked before every call (never more calls than the budget; like
``incr.Budget``, tokens and seconds may overshoot by the last call), the same visible checks
(with the same injected faults) and the same model. Hidden checks are never run here: ``Ctx``
refuses them, and scoring happens after the arm has returned (``score``).

- ``single``: generate every node once, run the visible checks, return if all pass.
- ``resample``: regenerate the nodes whose visible checks failed, fresh, with no feedback.
- ``whole``: when any check fails, regenerate every node; a blamed node gets its previous
  candidate and its counterexamples (the same feedback incr gives), the others their previous
  candidate and no counterexample.
- ``cache``: the whole pipeline again through a plain result cache keyed by the prompt (node,
  request text, the node's own feedback, its previous candidate when there is feedback): an
  unblamed node with an unchanged prompt is a cache hit.
- ``incr``: the real thing. One ``incr.Runtime`` per task; each node is an ``@incr.llm`` with
  an ``@incr.validator`` running its sync checks and ``incr.Budget``; a composing
  ``@incr.cell`` runs the downstream checks and ``raise incr.Reject(node, ...)``; in the
  late-verdict scenario the downstream verdicts arrive through ``rt.ack``/``rt.nack`` with the
  revision they judged, and ``incr.Acceptance(min_cases=...)`` waits for them.

Scenarios: ``clean``; ``flaky`` (each visible check execution is flipped, ACK<->NACK, with
probability ``flip``); ``late`` (the downstream check of a candidate is delivered 1-3 rounds
after it was produced, so verdicts for old candidates arrive after newer ones); ``upstream``
(the request's env changes from 1 to 2 after the first round has been generated and checked).
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from dataclasses import dataclass

import incr
from benchmarks.feedback.tasks import NodeSpec, Task, defects, run_check

ARMS = ("single", "resample", "whole", "cache", "incr")
SCENARIOS = ("clean", "flaky", "late", "upstream")
MAX_TICKS = 12


@dataclass(frozen=True)
class TaskBudget:
    calls: int
    tokens: int
    seconds: float


def budget_for(task: Task) -> TaskBudget:
    n = len(task.nodes)
    return TaskBudget(calls=3 * n, tokens=3 * n * 450, seconds=3 * n * 2.0)


class BudgetSpent(Exception):
    """The task's meter refused a model call (not an incr error: it propagates)."""


class RoundOver(Exception):
    """The harness holds a node to its first generation until the upstream change lands."""


class Ctx:
    """One arm on one task: the meter, the checks (with faults), the logs."""

    def __init__(self, arm, task: Task, scenario, model, seed, flip=0.1):
        self.arm, self.task, self.scenario, self.model, self.seed = arm, task, scenario, model, seed
        self.flip = flip if scenario == "flaky" else 0.0
        self.budget = budget_for(task)
        self.env = 1
        self.calls = self.tokens = 0
        self.seconds = 0.0
        self.k = defaultdict(int)
        self.gens: list = []           # (node, k, candidate, env)
        self.cur: dict = {}
        self.sync_ok: dict = {}        # node -> did its current candidate pass its sync checks
        self.checks_run = 0
        self.execs = defaultdict(int)
        self.rollbacks = 0
        self.cache_hits = 0
        self.phase1 = False
        self.stale = 0                 # late verdicts that judged an older candidate

    # -- the meter -------------------------------------------------------------------------

    def call(self, node: NodeSpec, previous, feedback):
        b = self.budget
        if self.calls >= b.calls or self.tokens >= b.tokens or self.seconds >= b.seconds:
            raise BudgetSpent(node.name)
        if node.name in self.cur and self.sync_ok.get(node.name):
            self.rollbacks += 1        # an accepted candidate is replaced
        c = self.model.generate(self.task, node, self.env, previous, tuple(feedback),
                                self.k[node.name])
        self.gens.append((node.name, self.k[node.name], c.candidate, self.env))
        self.k[node.name] += 1
        self.calls += 1
        self.tokens += c.tokens
        self.seconds += c.seconds
        self.cur[node.name] = c.candidate
        self.sync_ok[node.name] = False
        return c

    # -- visible checks, with injected faults -------------------------------------------------

    def check(self, node: NodeSpec, case: str, cand: str):
        kinds = {c.name: c.kind for c in node.checks}
        if kinds[case] == "hidden":
            raise AssertionError(f"hidden check {case} must never run inside a loop")
        self.checks_run += 1
        ok, cex = run_check(node, case, cand, self.env)
        if self.flip:
            key = (node.name, cand, case, self.env)
            n = self.execs[key]
            self.execs[key] += 1
            if random.Random(f"{self.seed}/{self.task.id}/flip/{node.name}/{cand}/{case}/"
                             f"{self.env}/{n}").random() < self.flip:
                ok = not ok
        cex = {"case": case, **cex} if isinstance(cex, dict) else {"case": case, "detail": cex}
        return ok, cex

    def delay(self, node: NodeSpec, cand: str, n: int) -> int:
        return random.Random(f"{self.seed}/{self.task.id}/late/{node.name}/{cand}/{n}").randint(1, 3)


def _nack(case, cex):
    return incr.NACK(case, counterexample=cex)


def _cexkey(v):
    return (v.case, json.dumps(v.counterexample, sort_keys=True, default=repr))


# --- the plain arms ---------------------------------------------------------------------------


def run_plain(ctx: Ctx) -> dict:
    task, arm, late = ctx.task, ctx.arm, ctx.scenario == "late"
    nodes = task.nodes
    table = {n.name: {} for n in nodes}      # case -> (ok, cex) for "the node": not revision-bound
    fb = {n.name: [] for n in nodes}         # every NACK seen, as feedback (regression cases)
    cache: dict = {}
    pending: list = []                       # (due tick, seq, node, case, ok, cex)
    submitted = defaultdict(int)
    seq = 0
    reason = None
    accepted = False

    def prompt_key(n, with_fb):
        if not with_fb:
            return (n.name, ctx.env)
        return (n.name, ctx.env, ctx.cur.get(n.name), tuple(_cexkey(v) for v in fb[n.name]))

    def gen(n, previous, feedback, key=None):
        if key is not None and key in cache:
            ctx.cache_hits += 1
            ctx.cur[n.name] = cache[key]
            return
        c = ctx.call(n, previous, feedback)
        if key is not None:
            cache[key] = c.candidate
        table[n.name] = {}

    def validate(n, fresh):
        nonlocal seq
        cand = ctx.cur[n.name]
        t = table[n.name]
        for c in n.sync + (() if late else n.down):
            t[c.name] = ctx.check(n, c.name, cand)
        if late and fresh:
            for c in n.down:
                t.pop(c.name, None)
                ok, cex = ctx.check(n, c.name, cand)
                d = ctx.delay(n, cand, submitted[(n.name, cand)])
                submitted[(n.name, cand)] += 1
                seq += 1
                pending.append((tick + d, seq, n, c.name, ok, cex, cand))
        ctx.sync_ok[n.name] = all(t.get(c.name, (False,))[0] for c in n.sync)
        for case, (ok, cex) in t.items():
            if not ok:
                v = _nack(case, cex)
                if _cexkey(v) not in {_cexkey(x) for x in fb[n.name]}:
                    fb[n.name].insert(0, v)

    fresh = {n.name: True for n in nodes}
    tick = 1
    try:
        for n in nodes:
            gen(n, None, (), prompt_key(n, False) if arm == "cache" else None)
        changed = False
        while True:
            if late:
                for item in sorted(p for p in pending if p[0] <= tick):
                    pending.remove(item)
                    _due, _s, n, case, ok, cex, judged = item
                    if judged != ctx.cur[n.name]:
                        ctx.stale += 1                  # a verdict about an older candidate
                    table[n.name][case] = (ok, cex)     # naive: to whatever is current
                    if not ok:
                        v = _nack(case, cex)
                        if _cexkey(v) not in {_cexkey(x) for x in fb[n.name]}:
                            fb[n.name].insert(0, v)
            for n in nodes:
                validate(n, fresh[n.name])
                fresh[n.name] = False
            if ctx.scenario == "upstream" and not changed:
                changed = True
                ctx.env = 2
                if arm != "single":
                    continue                            # the loop checks again under env 2
                # single generation ran and checked under env 1: it cannot see the change
            verdicts = {n.name: [table[n.name].get(c.name) for c in n.visible] for n in nodes}
            blamed = [n for n in nodes if any(v is not None and not v[0] for v in verdicts[n.name])]
            waiting = [n for n in nodes if any(v is None for v in verdicts[n.name])]
            if not blamed and not waiting:
                accepted = True
                break
            if arm == "single" and (blamed or not pending):
                reason = "rejected"
                break
            tick += 1
            if tick > MAX_TICKS:
                reason = "rounds"
                break
            if arm == "single":
                continue
            if arm == "resample":
                todo = [(n, None, ()) for n in blamed]
            elif arm == "whole":
                todo = ([(n, ctx.cur[n.name], fb[n.name] if n in blamed else ())
                         for n in nodes] if blamed else [])
            else:   # cache
                todo = [(n, ctx.cur[n.name] if n in blamed else None,
                         fb[n.name] if n in blamed else ()) for n in nodes
                        if n in blamed or prompt_key(n, False) not in cache]
            for n, prev, feedback in todo:
                key = None if arm != "cache" else prompt_key(n, bool(feedback))
                before = ctx.cur[n.name]
                gen(n, prev, tuple(feedback), key)
                fresh[n.name] = fresh[n.name] or ctx.cur[n.name] != before or not late
    except BudgetSpent:
        reason = "budget"
    return {"accepted": accepted, "escalation": None if accepted else reason,
            "final": dict(ctx.cur)}


# --- incr -------------------------------------------------------------------------------------


def run_incr(ctx: Ctx) -> dict:
    task, late = ctx.task, ctx.scenario == "late"
    rt = incr.Runtime(max_workers=1)
    env_in = rt.input("env", 1)
    b = ctx.budget
    nodes = {}

    def make(spec: NodeSpec):
        sync = spec.sync

        @incr.validator(version="1")
        def checks(cand, key):
            env_in.get()
            ok_all = True
            for c in sync:
                ok, cex = ctx.check(spec, c.name, cand)
                ok_all &= ok
                yield incr.ACK(c.name) if ok else _nack(c.name, cex)
            ctx.sync_ok[spec.name] = ok_all

        @incr.llm(validators=[checks], version="v1",
                  accept=incr.Acceptance(min_cases=len(sync) + (len(spec.down) if late else 0)),
                  budget=incr.Budget(max_attempts=b.calls, max_tokens=b.tokens))
        def node(key, *, previous=None, feedback=()):
            env_in.get()
            if ctx.phase1 and ctx.k[spec.name] >= 1:
                raise RoundOver(spec.name)
            c = ctx.call(spec, previous, feedback)
            return incr.Candidate(c.candidate, tokens=c.tokens)

        return node

    for spec in task.nodes:
        nodes[spec.name] = make(spec)

    @incr.cell(version="1")
    def compose(key):
        env_in.get()
        out = [nodes[s.name](key) for s in task.nodes]
        for spec, cand in zip(task.nodes, out):
            for c in spec.down:
                ok, cex = ctx.check(spec, c.name, cand)
                if not ok:
                    raise incr.Reject(nodes[spec.name], key, case=c.name, counterexample=cex)
        return tuple(out)

    accepted, reason = False, None
    with rt:
        if ctx.scenario == "upstream":
            ctx.phase1 = True
            for spec in task.nodes:
                try:
                    nodes[spec.name]("t")
                except (RoundOver, incr.NotAccepted):
                    pass
            try:
                compose("t")
            except (RoundOver, incr.NotAccepted, incr.Reject):
                pass
            ctx.phase1 = False
            env_in.set(2)
            ctx.env = 2
        if not late:
            for spec in task.nodes:          # every node gets its first candidate, as elsewhere
                try:
                    nodes[spec.name]("t")
                except (incr.NotAccepted, BudgetSpent):
                    pass
            try:
                compose("t")
                accepted = True
            except incr.NotAccepted as e:
                reason = e.reason
            except BudgetSpent:
                reason = "budget"
        else:
            accepted, reason = _incr_late(ctx, rt, task, nodes)
        final = {}
        for spec in task.nodes:
            try:
                final[spec.name] = rt.state(nodes[spec.name], "t").candidate
            except incr.IncrError:
                pass
        stats = rt.stats()
    rt.close()
    ctx.incr_stats = {k: stats.get(k) for k in ("generations", "validations")}
    return {"accepted": accepted, "escalation": None if accepted else reason, "final": final}


def _incr_late(ctx: Ctx, rt, task: Task, nodes: dict):
    """Downstream verdicts delivered late, with the revision they judged."""
    pending: list = []
    submitted: set = set()
    seq = 0
    reason = None
    for tick in range(1, MAX_TICKS + 1):
        for item in sorted(p for p in pending if p[0] <= tick):
            pending.remove(item)
            _due, _s, spec, rev, case, ok, cex = item
            node = nodes[spec.name]
            if rev != rt.state(node, "t").revision:
                ctx.stale += 1                  # history for incr: never moves the status
            if ok:
                rt.ack(node, "t", revision=rev, case=case)
            else:
                rt.nack(node, "t", revision=rev, case=case, counterexample=cex)
        status = {}
        for spec in task.nodes:
            node = nodes[spec.name]
            try:
                node("t")
                status[spec.name] = "stable"
            except incr.NotAccepted as e:
                status[spec.name] = e.reason
            except BudgetSpent:
                status[spec.name] = "budget"
            # the downstream checker sees every candidate revision produced, as in the other
            # arms. One context here, so revisions number the distinct candidates in order (a
            # candidate that comes back is no revision: incr stops with "oscillation")
            seen: list = []
            for name, _k, cand, _e in ctx.gens:
                if name == spec.name and cand not in seen:
                    seen.append(cand)
            for rev, cand in enumerate(seen, 1):
                if (spec.name, rev) in submitted:
                    continue
                submitted.add((spec.name, rev))
                for c in spec.down:
                    ok, cex = ctx.check(spec, c.name, cand)
                    seq += 1
                    pending.append((tick + ctx.delay(spec, cand, 0), seq, spec, rev,
                                    c.name, ok, cex))
        if all(s == "stable" for s in status.values()):
            return True, None
        if "budget" in status.values():
            return False, "budget"
        bad = [s for s in status.values() if s not in ("stable", "unknown")]
        if not pending:
            return False, bad[0] if bad else "unknown"
        reason = bad[0] if bad else "rounds"
    return False, reason


# --- scoring (after the arm returned; the only place hidden checks run) ----------------------


def score(ctx: Ctx, out: dict) -> dict:
    task, env = ctx.task, ctx.env
    final = out["final"]
    node_ok = {n.name: n.name in final and not defects(n, final[n.name], env) for n in task.nodes}
    correct = all(node_ok.values())
    first = {}
    for name, k, cand, _e in ctx.gens:
        if k == 0:
            first[name] = cand
    spec = {n.name: n for n in task.nodes}
    first_ok = {n: not defects(spec[n], c, env) for n, c in first.items()}
    broken = sum(1 for n, ok in first_ok.items() if ok and not node_ok.get(n, False))
    # per round: the candidate each node held after its r-th generation
    rounds = max((k + 1 for _n, k, _c, _e in ctx.gens), default=0)
    per_round = []
    for r in range(1, MAX_TICKS + 1):
        held = {}
        for name, k, cand, _e in ctx.gens:
            if k < r:
                held[name] = cand
        per_round.append(all(name in held and not defects(spec[name], held[name], env)
                             for name in spec))
    return {
        "task": task.id, "family": task.family, "control": task.control, "arm": ctx.arm,
        "scenario": ctx.scenario, "seed": ctx.seed,
        "success": bool(out["accepted"] and correct),
        "accepted": bool(out["accepted"]),
        "wrong_stable": bool(out["accepted"] and not correct),
        "escalated": not out["accepted"], "escalation": out["escalation"],
        "calls": ctx.calls, "tokens": ctx.tokens, "latency_s": round(ctx.seconds, 4),
        "checks_run": ctx.checks_run, "rounds": rounds, "rollbacks": ctx.rollbacks,
        "broken_first": broken,
        "first_all_correct": len(first_ok) == len(spec) and all(first_ok.values()),
        "control_broken": bool(task.control and len(first_ok) == len(spec)
                               and all(first_ok.values()) and not (out["accepted"] and correct)),
        "per_round": per_round, "cache_hits": ctx.cache_hits, "stale_verdicts": ctx.stale,
        "seen_cases": sorted(getattr(ctx.model, "seen_cases", {}).get(task.id, ())),
        "budget": [ctx.budget.calls, ctx.budget.tokens, ctx.budget.seconds],
    }


def run(arm: str, task: Task, scenario: str, model, seed: int, flip: float = 0.1) -> dict:
    ctx = Ctx(arm, task, scenario, model, seed, flip)
    out = run_incr(ctx) if arm == "incr" else run_plain(ctx)
    return score(ctx, out)
