"""Generators for the feedback benchmark: a seeded simulated model, and a real
OpenAI-compatible endpoint through incr.openai_chat (internal).

Both answer ``generate(task, node, env, previous, feedback, k)`` with a ``Call``. ``feedback``
is a tuple of ``incr.NACK`` (case, counterexample) built only from visible checks; ``k`` is the
index of this call for this node within one arm's run, so that every arm draws the same first
answer for the same (seed, task, node) (common random numbers).

THE SIMULATED MODEL IS A SIMULATION, NOT AN LLM. It draws candidates from the node's finite
space with these stated probabilities (``SimParams``):

- first answer (no ``previous``): correct (no defect, hidden ones included) with
  ``p_first``; in a control task always correct; otherwise a wrong candidate, uniformly;
- asked again with feedback F (the NACKed cases): with ``p_repeat`` it returns ``previous``
  unchanged; else with ``p_fix`` the counterexamples lead to a fix: a candidate that passes
  every case in F, which with ``p_break`` also breaks something ``previous`` got right (a new
  defect, visible or hidden) and otherwise adds no new defect; else the feedback did not help:
  any other candidate, uniformly;
- asked again without feedback, with ``previous`` (whole-graph retry of a node nobody
  blamed): with ``p_break`` the edit breaks something ``previous`` got right, else it returns
  ``previous``;
- resampling without feedback is a first answer again (k > 0: a fresh draw).

Tokens are counted from real text lengths (4 characters a token): a fixed instruction, the
request, the previous candidate and the counterexamples fed back, plus the answer. Simulated
latency: 0.4 s + 0.02 s per answer token + 0.0005 s per prompt token. Nothing sleeps.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, asdict

from benchmarks.feedback.tasks import NodeSpec, Task, defects

LABEL = "SIMULATED MODEL (seeded simulation, not an LLM)"


@dataclass(frozen=True)
class SimParams:
    p_first: float = 0.5     # chance that a first answer is correct
    p_fix: float = 0.6       # chance that a counterexample leads to a fix
    p_break: float = 0.15    # chance that an edit breaks what was right
    p_repeat: float = 0.1    # chance that the model returns its previous answer unchanged

    def as_dict(self):
        return asdict(self)


@dataclass
class Call:
    candidate: str
    prompt_tokens: int
    completion_tokens: int
    seconds: float

    @property
    def tokens(self):
        return self.prompt_tokens + self.completion_tokens


def _cex_text(feedback) -> str:
    parts = []
    for v in feedback:
        try:
            parts.append(v.case + json.dumps(v.counterexample, default=repr))
        except (TypeError, ValueError):
            parts.append(v.case + repr(v.counterexample))
    return "".join(parts)


def prompt_tokens(task: Task, node: NodeSpec, env: int, previous, feedback) -> int:
    text = node.prompt + task.env_text[env - 1] + (previous or "") + _cex_text(feedback)
    return 60 + len(text) // 4


class SimModel:
    label = LABEL

    def __init__(self, params: SimParams, seed: int):
        self.params = params
        self.seed = seed
        self.seen_cases: dict = {}       # task id -> every case name fed back (tests: no hidden one)

    def generate(self, task: Task, node: NodeSpec, env: int, previous, feedback, k: int) -> Call:
        p = self.params
        rng = random.Random(f"{self.seed}/{task.id}/{node.name}/{env}/{k}")
        space = node.space
        F = {v.case for v in feedback}
        self.seen_cases.setdefault(task.id, set()).update(F)

        def pick(cands):
            cands = sorted(set(cands), key=space.index)
            return rng.choice(cands) if cands else None

        def first():
            good = [c for c in space if not defects(node, c, env)]
            bad = [c for c in space if defects(node, c, env)]
            if task.control and k == 0:
                return pick(good)
            u = rng.random()
            return pick(good) if (u < p.p_first and good) or not bad else pick(bad)

        if previous is None:
            cand = first()
        else:
            D = defects(node, previous, env) if previous in space else None
            others = [c for c in space if c != previous]
            u_rep, u_fix, u_brk = rng.random(), rng.random(), rng.random()
            if not F:
                breaking = [c for c in others if D is None or defects(node, c, env) - D]
                cand = pick(breaking) if u_brk < p.p_break and breaking else previous
            elif u_rep < p.p_repeat:
                cand = previous
            elif u_fix < p.p_fix:
                fix = [c for c in others if not defects(node, c, env) & F]
                broke = [c for c in fix if D is None or defects(node, c, env) - D]
                clean = [c for c in fix if c not in broke]
                if u_brk < p.p_break:
                    cand = pick(broke) or pick(clean) or pick(others)
                else:
                    cand = pick(clean) or pick(broke) or pick(others)
            else:
                cand = pick(others)
        pt = prompt_tokens(task, node, env, previous, feedback)
        ct = max(4, len(cand) // 4)
        return Call(cand, pt, ct, 0.4 + 0.02 * ct + 0.0005 * pt)


class ChatModel:
    """The same interface on a real OpenAI-compatible endpoint (incr.openai_chat)."""

    def __init__(self, name: str, base_url: str | None):
        from incr.openai_chat import chat_generator

        self.label = f"REAL MODEL {name}" + (f" at {base_url}" if base_url else "")
        self.seen_cases: dict = {}
        self._gen = chat_generator(name, base_url=base_url, system=(
            "You write one artifact exactly as asked: SQL, a Python expression or a regular "
            "expression. Reply with the artifact only: no prose, no code fences."))

    def generate(self, task, node, env, previous, feedback, k) -> Call:
        self.seen_cases.setdefault(task.id, set()).update(v.case for v in feedback)
        t = time.perf_counter()
        out = self._gen(f"{node.prompt} Note: {task.env_text[env - 1]}", previous=previous,
                        feedback=tuple(feedback))
        seconds = time.perf_counter() - t
        text = out.value.strip() if hasattr(out, "value") else str(out).strip()
        if text.startswith("```"):
            text = "\n".join(line for line in text.splitlines()
                             if not line.startswith("```")).strip()
        tokens = getattr(out, "tokens", 0) or prompt_tokens(task, node, env, previous, feedback)
        return Call(text, tokens, 0, seconds)
