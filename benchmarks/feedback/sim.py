"""The SIMULATED model of the feedback benchmark (internal). It is a seeded simulation, not
an LLM; every output of the harness says so.

What it sees, and nothing else (``generate(prompt, previous, feedback, k)``):

- ``prompt``: what the node must write (its aspect names and which are easy), what the
  request asks for under the input in force (the right value of each aspect: a model of skill
  s gets it right with probability s), the upstream candidates it reads, and whether the task
  is a control. ``prompt_for`` builds it from the task's nodes and never reads its checks;
- ``previous``: its last candidate (a string) and ``feedback``: NACKs, each a case name and a
  counterexample ``{"aspect", "expected" (or None), "got"}`` built only from visible checks;
- its per-task latent skill s ~ Beta(skill_a, skill_b), drawn from (seed, task) alone.

It never sees a check, visible or hidden, a verdict it was not sent, or the right value of an
aspect except through the request (with probability s) and the counterexamples. Its edits:
for each NACK about the value it currently holds, generalise the fix (p_fix), special-case
the NACKed case (p_overfit) or redraw; a NACK without an expected value is a redraw right with
p_vague; every other aspect is independently redrawn uniformly with p_break (blind: it may
break a right aspect that only a hidden check covers). Asked without feedback it resamples.
All rates come from benchmarks/feedback/config.toml.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from benchmarks.feedback.tasks import Task, make, parse, patch_key, right_value

LABEL = "SIMULATED MODEL (seeded simulation, not an LLM)"


@dataclass(frozen=True)
class Prompt:
    task: str
    node: str
    aspects: tuple          # ((name, easy), ...)
    request: tuple          # ((aspect name, the value the request asks for), ...)
    upstream: tuple         # ((node, candidate), ...) as read now
    embed: bool
    control: bool
    inst: int = 0           # which input of a multi-instance task (its request says so)


def prompt_for(task: Task, node: str, env: int, current: dict) -> Prompt:
    """The prompt of one call. Reads ``task.nodes`` only: never ``task.checks``."""
    spec = task.node(node)
    return Prompt(task.id, node, tuple((a.name, a.easy) for a in spec.aspects),
                  tuple((a.name, right_value(a, env)) for a in spec.aspects),
                  tuple((r, current.get(r)) for r in spec.reads), spec.embed, task.control, env // 10)


@dataclass
class Call:
    candidate: str
    prompt_tokens: int
    completion_tokens: int
    cost: float
    seconds: float

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class SimModel:
    def __init__(self, cfg: dict, seed: int, strong: bool = False):
        self.m, self.c, self.st = cfg["model"], cfg["cost"], cfg["strong"]
        self.seed, self.strong = seed, strong
        self.label = LABEL + (" [stronger variant]" if strong else "")
        self.seen_cases: list = []           # every case name fed back (tests: never hidden)

    def skill(self, task_id: str) -> float:
        s = random.Random(f"skill/{self.seed}/{task_id}").betavariate(
            self.m["skill_a"], self.m["skill_b"])
        return 1 - (1 - s) * self.st["error_factor"] if self.strong else s

    def first_call_cost(self, prompt: Prompt) -> float:
        return self._tokens(prompt, None, ())[2]

    def _tokens(self, prompt, previous, feedback):
        c = self.c
        ct = c["answer_per_aspect"] * len(prompt.aspects)
        pt = (c["prompt_base"] + c["prompt_per_upstream"] * len(prompt.upstream)
              + (ct if previous is not None else 0) + c["prompt_per_feedback"] * len(feedback))
        price = c["price_per_token"] * (self.st["price_factor"] if self.strong else 1.0)
        return pt, ct, (pt + ct) * price

    def generate(self, prompt: Prompt, previous, feedback, k: int) -> Call:
        m = self.m
        inst = f"/i{prompt.inst}" if prompt.inst else ""
        rng = random.Random(f"gen/{self.seed}/{prompt.task}/{prompt.node}{inst}/{k}/"
                            f"{int(self.strong)}")
        s = self.skill(prompt.task)
        nvals = int(m["values"])
        want = dict(prompt.request)
        easy = dict(prompt.aspects)

        def draw(name, first):
            if prompt.control and first:
                return want[name]
            p = 1 - (1 - s) * m["easy_error_factor"] if easy[name] else s
            if rng.random() < p:
                return want[name]
            return rng.choice([v for v in range(nvals) if v != want[name]])

        feedback = tuple(feedback)
        self.seen_cases.extend(v.case for v in feedback)
        upstream = dict(prompt.upstream) if prompt.embed and prompt.upstream else None
        if previous is None or not feedback:
            own = {name: draw(name, k == 0) for name, _e in prompt.aspects}
            patched: set = set()
        elif rng.random() < m["p_repeat"]:
            return self._call(prompt, previous, feedback, previous)
        else:
            prev = parse(previous)
            own, patched = dict(prev["own"]), set(prev["p"])
            named, done = set(), set()
            for v in feedback:
                cex = v.counterexample if isinstance(v.counterexample, dict) else {}
                a, got, exp = cex.get("aspect"), cex.get("got"), cex.get("expected")
                key = (v.case, a, got)
                if a not in own or key in done or own[a] != got:
                    continue                 # not about what it holds now (or a repeat)
                done.add(key)
                named.add(a)
                u = rng.random()
                if exp is not None and exp != got:
                    if u < m["p_fix"]:
                        own[a] = exp
                    elif u < m["p_fix"] + m["p_overfit"]:
                        patched.add(patch_key(v.case, prompt.inst))
                    else:
                        own[a] = rng.randrange(nvals)
                elif exp is not None:        # its value is what was expected, yet it fails
                    if u < m["p_overfit"]:
                        patched.add(patch_key(v.case, prompt.inst))
                else:                        # blame passed upstream: no expected value
                    own[a] = want[a] if u < m["p_vague"] else rng.choice(
                        [x for x in range(nvals) if x != want[a]])
            for name, _e in prompt.aspects:
                if name not in named and rng.random() < m["p_break"]:
                    own[name] = rng.randrange(nvals)
        cand = make(prompt.node, own, patched, rng.randrange(10 ** 6), upstream)
        return self._call(prompt, previous, feedback, cand)

    def _call(self, prompt, previous, feedback, cand) -> Call:
        pt, ct, cost = self._tokens(prompt, previous, feedback)
        return Call(cand, pt, ct, cost, self.c["latency_base"] + self.c["latency_per_answer_token"] * ct)
