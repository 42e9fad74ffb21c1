"""A REAL model for the feedback benchmark, behind an OpenAI-compatible endpoint (internal).

``python -m benchmarks.feedback --model openai:NAME [--base-url URL]`` runs the arms with it
instead of the simulated model: ``ChatModel`` has ``SimModel``'s interface
(``generate(prompt, previous, feedback, k) -> Call``) and sees exactly what the simulation
sees -- the node's aspects, what the request asks for under the input in force, the upstream
answers it reads, its previous answer and the NACKs of visible checks -- rendered as text by
``render_prompt``, sent with ``incr.openai_chat.chat_generator`` (the official ``openai``
SDK; the key from ``OPENAI_API_KEY``, none needed with a local ``--base-url``).

What it is not: the tasks are abstract (an answer is a value per named aspect), and the
prompt states the value the request asks for, as the simulation's prompt does. A capable
model copies it; the run then measures the loops' plumbing and the model's instruction
following on this format, not how well a model repairs real artifacts. Its reply is parsed
leniently (the first JSON object in the text); an aspect it leaves out or answers with a
non-integer gets the value -1, which no check accepts. A candidate records no special-cased
("overfit") cases: that is a notion of the simulation.

Every call is recorded in ``transcript`` (shared by the runs of one ChatModel): the arm,
seed, task, node, instance and call index, the user message sent, the previous answer and
the feedback (case and counterexample) shown, the reply text, tokens and seconds;
``python -m benchmarks.feedback --model ...`` writes it next to the results as JSON lines
(``results-real.transcripts.jsonl``).

Tokens are what the server reports (``usage.total_tokens``); cost is tokens x the config's
``[cost] price_per_token``; seconds are measured. The spend axes' unit stays the simulated
size of one first call per node, so cost multiples are approximate with a real model (the
calls axis is exact).
"""

from __future__ import annotations

import json
import re
import time

from benchmarks.feedback.sim import Call, Prompt
from benchmarks.feedback.tasks import make

SYSTEM = ("You are one node of a pipeline. You answer with a JSON object that gives each "
          "named aspect an integer value, and nothing else.")


def render_prompt(prompt: Prompt, values: int) -> str:
    """The user message of a first call: what the node must write and what the request asks
    for; never a check."""
    lines = [f"Task {prompt.task}, node {prompt.node}"
             + (f", input {prompt.inst}" if prompt.inst else "") + ".",
             f"Write a value (an integer from 0 to {values - 1}) for each of these aspects: "
             + ", ".join(name for name, _easy in prompt.aspects) + ".",
             "The request asks for: " + ", ".join(f"{a} = {v}" for a, v in prompt.request)
             + "."]
    ups = [(n, c) for n, c in prompt.upstream if c is not None]
    if ups:
        lines.append("The upstream answers you read:")
        for n, c in ups:
            own = json.loads(c)["own"]
            lines.append(f"  {n}: {json.dumps(own, sort_keys=True)}")
    lines.append('Reply with the JSON object only, e.g. {"'
                 + '": 0, "'.join(name for name, _e in prompt.aspects) + '": 0}.')
    return "\n".join(lines)


def parse_reply(text: str, aspects) -> dict:
    """aspect -> int from a reply: the first {...} in it; -1 for what it does not answer."""
    found: dict = {}
    m = re.search(r"\{.*?\}", text or "", re.S)
    if m:
        try:
            d = json.loads(m.group(0))
            found = d if isinstance(d, dict) else {}
        except ValueError:
            found = {}
    out = {}
    for name in aspects:
        v = found.get(name)
        out[name] = v if isinstance(v, int) and not isinstance(v, bool) else -1
    return out


class ChatModel:
    """A real chat model with SimModel's interface (see the module's docstring)."""

    def __init__(self, cfg: dict, name: str, base_url: str | None = None,
                 api_key: str | None = None, gen=None, **chat_kwargs):
        self.values = int(cfg["model"]["values"])
        self.price = float(cfg["cost"]["price_per_token"])
        self.name, self.base_url = name, base_url
        self.label = f"REAL MODEL {name}" + (f" at {base_url}" if base_url else "")
        if gen is None:
            from incr.openai_chat import chat_generator
            gen = chat_generator(name, system=SYSTEM, base_url=base_url, api_key=api_key,
                                 price_per_token=self.price, **chat_kwargs)
        self.gen = gen
        self.seen_cases: list = []
        self.transcript: list = []
        self.run = {}

    def for_run(self, cfg: dict, **run) -> "ChatModel":
        """The same endpoint, client and transcript for one run (``run``: arm, seed, task,
        recorded with each call), with its own record of cases fed back."""
        m = ChatModel(cfg, self.name, self.base_url, gen=self.gen)
        m.transcript, m.run = self.transcript, dict(run)
        return m

    def generate(self, prompt: Prompt, previous, feedback, k: int) -> Call:
        feedback = tuple(feedback)
        self.seen_cases.extend(v.case for v in feedback)
        shown = None
        if previous is not None and feedback:
            # an edit: the previous answer, then the NACKs; asked without feedback, the model
            # is asked afresh (a resample), as the simulation is
            shown = json.dumps(json.loads(previous)["own"], sort_keys=True)
        user = render_prompt(prompt, self.values)
        t0 = time.perf_counter()
        out = self.gen(user, previous=shown, feedback=feedback if shown is not None else ())
        seconds = time.perf_counter() - t0
        self.transcript.append({
            **self.run, "node": prompt.node, "instance": prompt.inst, "k": k, "user": user,
            "previous": shown, "feedback": [{"case": v.case, "counterexample": v.counterexample}
                                            for v in feedback] if shown is not None else [],
            "reply": out.value, "tokens": int(out.tokens), "seconds": round(seconds, 4)})
        own = parse_reply(out.value, [a for a, _e in prompt.aspects])
        upstream = dict(prompt.upstream) if prompt.embed and prompt.upstream else None
        cand = make(prompt.node, own, (), 0, upstream)
        tokens = int(out.tokens)
        return Call(cand, tokens, 0, tokens * self.price, seconds)
