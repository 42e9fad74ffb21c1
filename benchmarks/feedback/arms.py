"""The arms of the feedback benchmark, one task at a time (internal). SIMULATED model.

Every arm spends through one ``Ctx`` meter (cost cap checked before every call; the last call
may overshoot), sees only visible checks and feedback built from them, and is scored after
it returned (``score``: the only place hidden checks run).

Blame is imprecise: a failing check's validator blames the true cause with probability
1 - p_misblame, otherwise another node on the failing case's dependency path. Every arm that
uses blame applies the same loop policy (``Ctx.blame``): when a case fails again right after
the node it was blamed on was regenerated, blame climbs one node upstream (cycling back to the
checked node after the top); a case that passes resets it.

- ``single``: every node once, check, return if all visible checks pass.
- ``resample``: regenerate the blamed nodes and everything downstream of them, fresh, with no
  feedback (best-of-n with blame).
- ``whole``: regenerate every node: blamed ones with their previous candidate and the
  accumulated counterexamples, the others re-asked without feedback (a fresh sample).
- ``cache``: the pipeline again through a prompt-keyed cache (node, request, upstream answers,
  its accumulated feedback): a blamed node misses (new feedback), so does every node whose
  upstream answer changed; the rest are hits.
- ``recheck``: the hand-written "re-check, then regenerate" loop: regenerate only the blamed
  nodes with feedback, re-run only the checks whose inputs changed (results cached by the
  candidates on the case's path), regenerate a downstream node only when its re-check fails.
- ``incr``: the engine. One ``incr.Runtime`` per task; each node an ``@incr.llm`` whose
  generator reads its upstream nodes and whose ``@incr.validator`` runs its sync checks
  (NACK for itself, ``incr.Reject`` when blame points upstream); a composing ``@incr.cell``
  runs the downstream checks and raises ``incr.Reject(node, ...)``. ``incr_par`` is the same
  with ``max_workers=4`` driven by ``rt.observe`` + ``rt.stabilize()``, every demand of
  several nodes made through ``incr.gather`` (the engine makes their model calls at once; the
  calls and values are those of demanding them in order, and a test checks the runs equal).
- ``incr_reuse``: ``incr`` with ``@incr.llm(reuse="revalidate")``: on a task with several
  instances, a node's new instance first re-validates the accepted candidate of the previous
  instance under its own validators, accepted only on that evidence; if it fails, the
  generator starts from it with the NACKs. On single-instance tasks it is ``incr``.
- ``incr_norevert``: ``incr`` without keep-or-revert. The engine has no switch for it: after
  a regression it hands the generator the best revision as ``previous`` (``st.base``); this
  arm's generator builds on the node instance's latest candidate instead, which is what the
  engine hands it in every other case. The engine still records the revision as "reverted"
  and emits ``Reverted`` (it decided to); nothing else differs (feedback, monitors, budget).
  ``ctx.previous_log`` records, per call, what the engine handed and what was used.
- ``strong``: the ``resample`` loop with the stronger, dearer model.

Every incr arm but ``incr_norevert`` runs with the loop control of the engine's defaults
(keep-or-revert on), and every one with the pre-registered ``[incr] patience`` (divergence
monitor). Multi-instance tasks run their
instances in turn on one meter; every arm runs each instance's loop in full.

Concurrency (the wall-time run, ``Ctx.workers``): a plain arm makes the calls of one graph
level (nodes none of which reads another) at once in threads; the incr arms run as above. Every
call sleeps its simulated latency times the run's scale outside the meter's lock, and the
meter counts the calls in flight (``peak_in_flight``).

Flaky validators (``[validator] p_flaky``): every visible check evaluation gives the wrong
verdict with that probability, drawn afresh each time it is evaluated (so the same candidate
may get both verdicts).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor

import incr
from benchmarks.feedback.sim import SimModel, prompt_for
from benchmarks.feedback.tasks import (Task, blame_path, cause, check_passes, env_of, fresh,
                                       parse, path, right_value)

ARMS = ("single", "resample", "whole", "cache", "recheck", "incr", "incr_norevert",
        "incr_reuse", "incr_par", "strong")
FEEDBACK_ARMS = ("whole", "cache", "recheck", "incr", "incr_norevert", "incr_reuse", "incr_par")
INCR_ARMS = ("incr", "incr_norevert", "incr_reuse", "incr_par")


# The model every arm calls: None = the SIMULATED model (sim.SimModel); else a real one
# (real.ChatModel, set by ``python -m benchmarks.feedback --model openai:NAME``; see use_model).
REAL_MODEL = None


def use_model(model):
    """Make every run call ``model`` (a real.ChatModel), or the simulation again (None);
    returns the previous setting."""
    global REAL_MODEL
    prev, REAL_MODEL = REAL_MODEL, model
    return prev


class BudgetSpent(Exception):
    """The task's meter refused a model call (not an incr error: it propagates)."""


class RoundOver(Exception):
    """Holds a node to its first answer until the upstream change lands."""


class Fb:
    """A NACK as the plain loops feed it (the same fields as incr.NACK)."""
    __slots__ = ("case", "counterexample")

    def __init__(self, case, counterexample):
        self.case, self.counterexample = case, counterexample


def unit_cost(task: Task, cfg: dict) -> tuple[float, int]:
    """Cost and tokens of one base-model first call per node: the unit of the spend axes."""
    m = SimModel(cfg, 0)
    cost = tokens = 0
    for n in task.nodes:
        p = prompt_for(task, n.name, 1, {})
        pt, ct, c = m._tokens(p, None, ())
        cost += c
        tokens += pt + ct
    return cost * task.instances, tokens * task.instances


def unit_latency(task: Task, cfg: dict) -> float:
    """Simulated seconds of one base-model first call per node, one after the other: the unit
    of the wall-time axis (times the wall-time run's sleep scale)."""
    m = SimModel(cfg, 0)
    c = cfg["cost"]
    secs = 0.0
    for n in task.nodes:
        _pt, ct, _c = m._tokens(prompt_for(task, n.name, 1, {}), None, ())
        secs += c["latency_base"] + c["latency_per_answer_token"] * ct
    return secs * task.instances


class Ctx:
    def __init__(self, arm: str, task: Task, cfg: dict, seed: int, cap_multiple=None,
                 sleep_scale: float = 0.0):
        self.arm, self.task, self.cfg, self.seed = arm, task, cfg, seed
        if REAL_MODEL is None:
            self.model = SimModel(cfg, seed, strong=(arm == "strong"))
        elif arm == "strong":
            raise ValueError("the strong arm is the simulated stronger model: with a real "
                             "model, leave it out of --arms")
        else:
            self.model = REAL_MODEL.for_run(cfg, arm=arm, seed=seed, task=task.id)
        h = cfg["harness"]
        self.unit, self.unit_tokens = unit_cost(task, cfg)
        mult = cap_multiple
        if mult is None:   # the stronger model gets the same number of rounds' worth of tokens
            mult = h["run_cap_multiple"] * (cfg["strong"]["price_factor"] if arm == "strong" else 1)
        self.cap = mult * self.unit
        self.sleep_scale = sleep_scale
        self.base_env = 1            # the request version (the upstream family changes it)
        self.inst = 0                # the instance running now
        self.curs: dict = defaultdict(dict)     # instance -> node -> candidate in force
        self.firsts: dict = defaultdict(dict)   # instance -> node -> first candidate
        self.k = defaultdict(int)    # (node, instance) -> model calls
        self.log: list = []          # (node, k, cost, tokens, instance, candidate, env)
        self.flips = 0               # visible check verdicts a flaky validator got wrong
        self.flaky_n: dict = defaultdict(int)
        self.attempts: list = []     # incr arms: (node, instance, index, outcome, reused)
        # incr arms, per retry: (node, instance, previous the engine handed, previous used,
        # the node instance's latest candidate)
        self.previous_log: list = []
        self.events: dict = {}       # incr arms: event type -> count (rt.on_event)
        self.reused = self.reused_accepted = self.reuse_unbacked = 0
        self.calls = self.tokens = 0
        self.cost = self.seconds = 0.0
        self.checks_run = 0
        self.climbs = 0
        self.kept = 0                # downstream candidates kept by re-validation
        # incr arms, per node demanded by a composing pass after its first: answered with no
        # model call and no validator run (the PASS path), or with validators only
        # (re-validated, no model call)
        self.passes = self.revalidated = 0
        self.first_call_seen: set = set()
        self.cache_hits = 0
        self.levels: dict = {}
        self.phase1 = False
        self.capped = False
        self.lock = threading.Lock()
        # concurrency: threads a plain arm uses for the independent calls of one graph level
        # (1 = in order; the wall-time run sets more), model calls in flight now and at most
        # (counted from the meter's grant to the end of the call's latency sleep), and a hook
        # run in the calling thread after each call (tests put a barrier there)
        self.workers = 1
        self.in_flight = self.peak_in_flight = 0
        self.after_call = None

    @property
    def env(self) -> int:
        """The context code of checks and prompts: request version and instance."""
        return env_of(self.base_env, self.inst)

    @env.setter
    def env(self, value: int) -> None:
        self.base_env = value

    @property
    def cur(self) -> dict:
        return self.curs[self.inst]

    @property
    def first(self) -> dict:
        return self.firsts[self.inst]

    # -- the meter -------------------------------------------------------------------------

    def call(self, node: str, previous, feedback, current=None):
        prompt = prompt_for(self.task, node, self.env, self.cur if current is None else current)
        with self.lock:
            if self.cost >= self.cap:
                self.capped = True
                raise BudgetSpent(node)
            k = self.k[(node, self.inst)]
            self.k[(node, self.inst)] += 1
            c = self.model.generate(prompt, previous, tuple(feedback), k)
            self.calls += 1
            self.tokens += c.tokens
            self.cost += c.cost
            self.seconds += c.seconds
            self.log.append((node, k, c.cost, c.tokens, self.inst, c.candidate, self.env))
            self.cur[node] = c.candidate
            self.first.setdefault(node, c.candidate)
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            if self.sleep_scale:
                time.sleep(c.seconds * self.sleep_scale)
            if self.after_call is not None:
                self.after_call(node, k, self.inst)
        finally:
            with self.lock:
                self.in_flight -= 1
        return c

    # -- checks and blame ----------------------------------------------------------------------

    def run_check(self, chk, current) -> bool:
        if not chk.shown:
            raise AssertionError(f"hidden check {chk.name} must never run inside a loop")
        self.checks_run += 1
        ok = check_passes(self.task, chk, current, self.env)
        p = self.cfg["validator"].get("p_flaky", 0.0)
        if p:
            on_path = tuple(x[2] for x in path(self.task, chk.node, chk.aspect,
                                                current.get(chk.node), current))
            key = f"{chk.name}/{self.env}/{on_path}"
            i = self.flaky_n[key]
            self.flaky_n[key] += 1
            if random.Random(f"flaky/{self.seed}/{self.task.id}/{key}/{i}").random() < p:
                ok = not ok
                self.flips += 1
        if ok:
            self.levels.pop(chk.name, None)
        return ok

    def fresh(self, node: str, current) -> Fb | None:
        """The structural freshness check of an embedding node: None, or the NACK (blaming
        the node itself: it must re-read its upstream)."""
        if not self.task.node(node).embed:
            return None
        self.checks_run += 1
        if fresh(self.task, node, current):
            return None
        return Fb(f"{node}_fresh", {"case": f"{node}_fresh", "aspect": None, "expected": None,
                                    "got": None})

    def blame(self, chk, current) -> tuple[str, dict]:
        """(node to regenerate, counterexample) for a failing visible check."""
        task = self.task
        bp = blame_path(task, chk)
        names = [n for n, _a in bp]
        pos_true = names.index(cause(task, chk, current, self.env))
        on_path = "|".join(str(current.get(n)) for n in names)
        rng = random.Random(f"blame/{self.seed}/{task.id}/{chk.name}/{self.env}/{on_path}")
        pos_v = pos_true
        if len(bp) > 1 and rng.random() < self.cfg["validator"]["p_misblame"]:
            pos_v = rng.choice([i for i in range(len(bp)) if i != pos_true])
        pos = max(pos_v, self.levels.get(chk.name, 0))
        if pos > pos_v:
            self.climbs += 1
        self.levels[chk.name] = (pos + 1) % len(bp)
        node, aspect = bp[pos]
        got = parse(current[node])["own"].get(aspect)
        exp = right_value(task.node(node).aspect(aspect), self.env) if pos == 0 else None
        return node, {"case": chk.name, "aspect": aspect, "expected": exp, "got": got}


# --- the plain arms ---------------------------------------------------------------------------


def run_plain(ctx: Ctx) -> dict:
    task, arm = ctx.task, ctx.arm
    order = [n.name for n in task.nodes]
    reads = {n.name: n.reads for n in task.nodes}
    fb: dict = {n: [] for n in order}
    cache: dict = {}
    checked: dict = {}
    h = ctx.cfg["harness"]

    def gen(n, with_fb):
        if with_fb and fb[n]:
            ctx.call(n, ctx.cur.get(n), fb[n])
        else:
            ctx.call(n, None, ())

    def gen_cached(n):
        key = (n, ctx.env, tuple(ctx.cur.get(r) for r in reads[n]),
               tuple((v.case, json.dumps(v.counterexample, sort_keys=True)) for v in fb[n]))
        if key in cache:
            with ctx.lock:
                ctx.cache_hits += 1
                ctx.cur[n] = cache[key]
            return
        gen(n, True)
        cache[key] = ctx.cur[n]

    def evaluate():
        fails = []
        for c in task.visible:
            if arm == "recheck":
                key = (c.name, ctx.env, tuple(x[2] for x in path(task, c.node, c.aspect,
                                                                  ctx.cur.get(c.node), ctx.cur)))
                if key not in checked:
                    checked[key] = ctx.run_check(c, ctx.cur)
                ok = checked[key]
                if ok:
                    ctx.levels.pop(c.name, None)
            else:
                ok = ctx.run_check(c, ctx.cur)
            if not ok:
                fails.append(c)
        stale = {}
        for n in order:
            v = ctx.fresh(n, ctx.cur)
            if v is not None:
                stale[n] = v
        return fails, stale

    depth: dict = {}
    for n in order:
        depth[n] = 1 + max((depth[r] for r in reads[n]), default=-1)
    pool = None

    def each(names, fn):
        """fn(n) for the nodes ``names`` (in topological order), level by level; the nodes of
        one level (none reads another) at once in ``ctx.workers`` threads. Their model calls
        do not depend on the order (each call's random numbers are keyed by node and index);
        where the meter runs out inside a level, which of them it refuses may."""
        nonlocal pool
        names = list(names)
        if ctx.workers <= 1:
            for n in names:
                fn(n)
            return
        for lv in sorted({depth[n] for n in names}):
            group = [n for n in names if depth[n] == lv]
            if len(group) == 1:
                fn(group[0])
                continue
            if pool is None:
                pool = ThreadPoolExecutor(max_workers=ctx.workers)
            futs = [pool.submit(fn, n) for n in group]
            errs = [f.exception() for f in futs]
            for e in errs:
                if e is not None:
                    raise e

    reached = [1]

    def one() -> tuple:
        """One instance's loop: (accepted, reason, rounds); BudgetSpent propagates."""
        for n in order:
            fb[n] = []
        accepted, reason, rounds = False, None, 1
        each(order, gen_cached if arm == "cache" else (lambda n: gen(n, False)))
        changed = False
        while True:
            fails, stale = evaluate()
            if task.env_change and not changed:
                changed = True
                ctx.env = 2                     # the request changes after round 1
                if arm == "single":
                    accepted, reason = not fails, (None if not fails else "rejected")
                    break
                continue
            if not fails and not stale:
                accepted = True
                break
            if arm == "single":
                reason = "rejected"
                break
            rounds += 1
            reached[0] = max(reached[0], rounds)
            if rounds > h["max_rounds"]:
                reason = "rounds"
                break
            blamed: dict = {n: [v] for n, v in stale.items()}
            for c in fails:
                t, cex = ctx.blame(c, ctx.cur)
                blamed.setdefault(t, []).append(Fb(c.name, cex))
            for t, items in blamed.items():
                fb[t] = items + fb[t]
            hit = set(blamed)
            if arm in ("resample", "strong"):
                for t in list(blamed):
                    hit.update(task.downstream(t))
                each([n for n in order if n in hit], lambda n: gen(n, False))
            elif arm == "whole":
                each(order, lambda n: gen(n, n in blamed))
            elif arm == "cache":
                each(order, gen_cached)
            elif arm == "recheck":
                each([n for n in order if n in blamed], lambda n: gen(n, True))
            else:
                raise ValueError(arm)
        return accepted, reason, rounds

    accepted, reason = True, None
    try:
        for inst in range(task.instances):
            ctx.inst = inst
            ctx.levels.clear()
            ok, why, _r = one()
            if not ok:
                accepted = False
                reason = reason or why
    except BudgetSpent:
        accepted, reason = False, "budget"
    finally:
        if pool is not None:
            pool.shutdown()
    return {"accepted": accepted, "reason": None if accepted else reason,
            "final": {i: dict(ctx.curs[i]) for i in range(task.instances)},
            "rounds": min(reached[0], h["max_rounds"] + 1)}


# --- incr -------------------------------------------------------------------------------------


def _ancestors(task: Task, name: str) -> list:
    out, todo = [], list(task.node(name).reads)
    while todo:
        r = todo.pop()
        if r not in out:
            out.append(r)
            todo.extend(task.node(r).reads)
    return [n.name for n in task.nodes if n.name in out]


def run_incr(ctx: Ctx, workers: int = 1, reuse: bool = False, revert: bool = True) -> dict:
    task = ctx.task
    rt = incr.Runtime(max_workers=workers)
    env_in = rt.input("env", 1)
    go = rt.input("go", workers == 1)
    nodes: dict = {}
    validated: dict = defaultdict(set)
    down = [c for c in task.visible if c.where == "down"]
    keys = ["t"] + [f"t{i}" for i in range(1, task.instances)]
    patience = int(ctx.cfg.get("incr", {}).get("patience", 2))
    seen: Counter = Counter()
    seen_lock = threading.Lock()
    vruns: Counter = Counter()       # (node, key) -> validator runs

    acked: set = set()

    def demand(names, key) -> dict:
        """The nodes ``names`` of instance ``key``: with workers, through ``incr.gather`` (the
        engine makes their model calls at once; values, dependencies and calls are those of
        demanding them in order), else one after the other."""
        names = list(names)
        if workers > 1 and len(names) > 1:
            return dict(zip(names, incr.gather(*[(lambda n=n: nodes[n](key)) for n in names])))
        return {n: nodes[n](key) for n in names}

    def on_event(e):
        kind = type(e).__name__
        with seen_lock:
            seen[kind] += 1
            if kind == "Stopped":
                seen["Stopped:" + str(e.reason)] += 1
            elif kind == "Verdict" and getattr(e.verdict, "kind", "") == "ACK":
                acked.add((e.label, e.revision))
            elif kind == "Accepted" and (e.label, e.revision) not in acked:
                seen["accepted_without_ack"] += 1    # must stay 0: no evidence, no acceptance

    def here(key):
        if key != keys[ctx.inst]:
            raise AssertionError(f"instance {key} ran while {keys[ctx.inst]} was in force")

    def make(spec):
        sync = [c for c in task.visible if c.node == spec.name and c.where == "sync"]
        anc = _ancestors(task, spec.name)

        @incr.validator(version="1")
        def checks(cand, key):
            env_in.get()
            here(key)
            with seen_lock:
                vruns[(spec.name, key)] += 1
            current = demand(anc, key)
            current[spec.name] = cand
            out = [incr.ACK("well_formed")]
            reject = None
            all_ok = True
            stale = ctx.fresh(spec.name, {**current, **{r: nodes[r](key) for r in spec.reads}})
            if stale is not None:
                out.append(incr.NACK(stale.case, counterexample=stale.counterexample))
                all_ok = False
            elif spec.embed and spec.reads:
                # a validator answers every case it checks on every revision: a case it
                # NACKed once and no longer mentions is UNKNOWN (a regression case)
                out.append(incr.ACK(f"{spec.name}_fresh"))
            for c in sync:
                if ctx.run_check(c, current):
                    out.append(incr.ACK(c.name))
                    continue
                all_ok = False
                target, cex = ctx.blame(c, current)
                if target == spec.name:
                    out.append(incr.NACK(c.name, counterexample=cex))
                elif reject is None and not ctx.phase1:
                    reject = incr.Reject(nodes[target], key, case=c.name, counterexample=cex)
            if reject is not None:
                raise reject
            if all_ok:
                if cand in validated[(spec.name, key)]:
                    ctx.kept += 1            # re-validated in a new context and kept
                validated[(spec.name, key)].add(cand)
            return out

        def gen(key, *, previous=None, feedback=()):
            env_in.get()
            here(key)
            current = demand(spec.reads, key)
            if ctx.phase1 and ctx.k[(spec.name, ctx.inst)] >= 1:
                raise RoundOver(spec.name)
            if previous is not None:
                latest = ctx.cur.get(spec.name, previous)
                used = previous if revert else latest
                ctx.previous_log.append((spec.name, ctx.inst, previous, used, latest))
                previous = used
            c = ctx.call(spec.name, previous, feedback, current)
            return incr.Candidate(c.candidate, tokens=c.tokens, cost=c.cost)

        gen.__name__ = gen.__qualname__ = spec.name     # labels name the node: n2('t1')
        return incr.llm(validators=[checks], version="v1", accept=incr.Acceptance(min_cases=1),
                        budget=incr.Budget(max_attempts=100), patience=patience,
                        reuse="revalidate" if reuse else None)(gen)

    for spec in task.nodes:
        nodes[spec.name] = make(spec)

    @incr.cell(version="1")
    def compose(key):
        if not go.get():
            return None
        env_in.get()
        here(key)
        names = [n.name for n in task.nodes]
        before = {n: (ctx.k[(n, ctx.inst)], vruns[(n, key)]) for n in names}
        current = demand(names, key)
        for n in names:
            if (n, ctx.inst) in ctx.first_call_seen and ctx.k[(n, ctx.inst)] == before[n][0]:
                if vruns[(n, key)] == before[n][1]:
                    ctx.passes += 1          # PASS: the candidate back with no call, no check
                else:
                    ctx.revalidated += 1     # re-validated (validators ran), no model call
            ctx.first_call_seen.add((n, ctx.inst))
        for c in down:
            if not ctx.run_check(c, current) and not ctx.phase1:
                target, cex = ctx.blame(c, current)
                raise incr.Reject(nodes[target], key, case=c.name, counterexample=cex)
        return tuple(current[n.name] for n in task.nodes)

    stop = (RoundOver, BudgetSpent, incr.NotAccepted)
    accepted, reason = True, None
    unsubscribe = rt.on_event(on_event)
    with rt:
        obs: dict = {}

        def step(key):
            if workers > 1:
                if key not in obs:
                    obs[key] = rt.observe(compose, key)
                rt.stabilize()
                return obs[key].value
            return compose(key)

        if task.env_change:
            ctx.phase1 = True
            if workers > 1:
                go.set(True)
            try:
                step("t")
            except stop:
                pass
            ctx.phase1 = False
            ctx.levels.clear()
            env_in.set(2)
            ctx.env = 2
        elif workers > 1:
            go.set(True)
        for i, key in enumerate(keys):
            ctx.inst = i
            ctx.levels.clear()
            try:
                ok = step(key) is not None
            except incr.NotAccepted as e:
                ok, reason = False, reason or e.reason
            except BudgetSpent:
                accepted, reason = False, "budget"   # cut: the budget is the reason to report
                break
            if not ok:
                accepted = False
                reason = reason or "unknown"
            if key in obs:
                obs.pop(key).stop()          # the next instance runs on its own
        final: dict = {}
        for i, key in enumerate(keys):
            final[i] = {}
            for spec in task.nodes:
                try:
                    st = rt.state(nodes[spec.name], key)
                except incr.IncrError:
                    continue
                if st.candidate is not None:
                    final[i][spec.name] = st.candidate
                last = len(st.attempts) - 1
                for x, a in enumerate(st.attempts):
                    reused = str(a.get("note") or "").startswith("reused from")
                    # "" : the attempt's validation was set aside (a Reject raised in it, or
                    # the harness holding the node to its first answer): "interrupted"
                    outcome = str(a.get("outcome") or "interrupted").split(":")[0]
                    if x == last and st.status == "failed":
                        # the attempt the loop stopped on: the engine records "stopped: why",
                        # "" for a repeated candidate, "rejected" before a divergence stop
                        outcome = "stopped"
                    ctx.attempts.append((spec.name, i, x, outcome, reused))
                    if reused:
                        ctx.reused += 1
                        ctx.firsts[i].setdefault(spec.name, a["candidate"])
                        if outcome == "accepted":
                            ctx.reused_accepted += 1
        stats = rt.stats()
    unsubscribe()
    rt.close()
    ctx.events = dict(seen)
    ctx.reuse_unbacked = seen.get("accepted_without_ack", 0)
    ctx.incr_stats = {k: stats.get(k) for k in ("generations", "validations")}
    rounds = max(ctx.k.values(), default=0)
    return {"accepted": accepted, "reason": None if accepted else (reason or "unknown"),
            "final": final, "rounds": rounds}


# --- scoring (after the arm returned; the only place hidden checks run) ----------------------


def own_ok(task: Task, node: str, cand, env: int) -> bool:
    """The node's own answer is right (every aspect it writes; upstream not looked at)."""
    if cand is None:
        return False
    own = parse(cand)["own"]
    return all(own.get(a.name) == right_value(a, env) for a in task.node(node).aspects)


def per_attempt(ctx: Ctx) -> list:
    """Per attempt index k >= 1 of a node instance (its k-th model call after the first):
    [wrong before, fixed, right before, broken, right before and first answer right, of those
    broken]. "Before" is the candidate in force before that call (the node instance's last
    one, or the reused one); judged under the request in force at the call. Scoring only."""
    task = ctx.task
    rows: dict = defaultdict(lambda: [0] * 6)
    last: dict = {}
    first_right: dict = {}
    for inst, firsts in ctx.firsts.items():
        for n, c in firsts.items():
            last[(n, inst)] = None
    for node, k, _c, _t, inst, cand, env in ctx.log:
        key = (node, inst)
        before = last.get(key)
        if key not in first_right:
            first_right[key] = own_ok(task, node, ctx.firsts[inst].get(node), env)
        if k >= 1 or before is not None:
            r = rows[max(k, 1)]
            b, a = own_ok(task, node, before, env), own_ok(task, node, cand, env)
            if not b:
                r[0] += 1
                r[1] += a
            else:
                r[2] += 1
                r[3] += not a
                if first_right[key]:
                    r[4] += 1
                    r[5] += not a
        last[key] = cand
    return [[k] + rows[k] for k in sorted(rows)]


def score(ctx: Ctx, out: dict) -> dict:
    task = ctx.task
    acc = bool(out["accepted"])
    correct = visible_ok = first_all = True
    broken = protective = 0
    for inst in range(task.instances):
        env = env_of(ctx.base_env, inst)
        final = out["final"].get(inst, {})
        first = ctx.firsts[inst]
        ok = {c.name: check_passes(task, c, final, env) for c in task.checks}
        first_ok = {c.name: check_passes(task, c, first, env) for c in task.checks}
        correct &= all(ok.values())
        visible_ok &= all(ok[c.name] for c in task.visible)
        first_all &= all(first_ok.values())

        def node_ok(table, n):
            return all(table[c.name] for c in task.checks if c.node == n.name)

        broken += sum(1 for n in task.nodes if node_ok(first_ok, n) and not node_ok(ok, n))
        protective += sum(1 for c in task.checks if c.kind == "protective"
                          and first_ok[c.name] and not ok[c.name])
    outcomes: dict = defaultdict(Counter)
    for _n, _i, x, outcome, _r in ctx.attempts:
        outcomes[x][outcome] += 1          # x: retries before it (0 = first answer)
    return {
        "task": task.id, "family": task.family, "control": task.control, "arm": ctx.arm,
        "seed": ctx.seed, "success": acc and correct, "accepted": acc,
        "wrong_accepted": acc and not correct, "escalated": not acc, "reason": out["reason"],
        "visible_ok": visible_ok, "protective_broken": protective,
        "first_all_correct": first_all, "broken_first": broken,
        "calls": ctx.calls, "tokens": ctx.tokens, "cost": round(ctx.cost, 6),
        "latency_s": round(ctx.seconds, 4), "checks_run": ctx.checks_run,
        "rounds": out["rounds"], "climbs": ctx.climbs, "kept": ctx.kept,
        "cache_hits": ctx.cache_hits, "capped": ctx.capped, "flips": ctx.flips,
        "passes": ctx.passes, "revalidated": ctx.revalidated,
        "reused": ctx.reused, "reused_accepted": ctx.reused_accepted,
        "reuse_unbacked": ctx.reuse_unbacked,
        "reverts": ctx.events.get("Reverted", 0), "regressions": ctx.events.get("Regression", 0),
        # retries that built on an earlier revision than the node instance's latest (after a
        # revert; 0 in incr_norevert by construction), and those where the engine handed one
        "rebased": sum(1 for x in ctx.previous_log if x[3] != x[4]),
        "engine_rebased": sum(1 for x in ctx.previous_log if x[2] != x[4]),
        "events": ctx.events,
        "outcomes_by_attempt": {str(k): dict(v) for k, v in sorted(outcomes.items())},
        "per_attempt": per_attempt(ctx),
        "unit": ctx.unit, "unit_tokens": ctx.unit_tokens,
        "nodes": len(task.nodes) * task.instances, "instances": task.instances,
        "log": [(round(x[2], 6), x[3]) for x in ctx.log],
        "seen_cases": sorted(set(ctx.model.seen_cases)),
    }


def execute(ctx: Ctx) -> dict:
    """Run ctx's arm on its task (not scored)."""
    arm = ctx.arm
    if arm in ("incr", "incr_reuse", "incr_norevert"):
        return run_incr(ctx, 1, reuse=arm == "incr_reuse", revert=arm != "incr_norevert")
    if arm == "incr_par":
        return run_incr(ctx, 4)
    return run_plain(ctx)


def run(arm: str, task: Task, cfg: dict, seed: int, cap_multiple=None, sleep_scale=0.0) -> dict:
    ctx = Ctx(arm, task, cfg, seed, cap_multiple, sleep_scale)
    return score(ctx, execute(ctx))
