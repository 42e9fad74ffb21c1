"""What a loop that stopped without acceptance tells its user (internal): the readable report
(NotAccepted.report, built by _report), the next step for each reason to stop, FailureReport
(what on_failure is called with), and the one-line rendering of a candidate (_text).

Invariants it keeps: a report is made from the node's state alone, and rendering a value never
raises (one whose repr() raises is shown as such); each reason NotAccepted documents has its
explanation and its next step.
"""

from __future__ import annotations

from typing import Any

from incr.errors import NotAccepted
from incr._llm_book import _graph_figures
from incr._llm_types import NACK, UNKNOWN, _Node


class FailureReport(str):
    """What ``on_failure(report)`` is called with: the readable report of the loop that ended
    without acceptance (a ``str``, the same text as ``NotAccepted.report``), which also carries
    ``.reason``, ``.best`` (the candidate with most distinct ACKs), ``.attempts`` and ``.error``
    (the ``incr.NotAccepted`` that is raised if ``on_failure`` returns None)."""

    def __new__(cls, error: NotAccepted):
        self = super().__new__(cls, error.report)
        self.error = error
        return self

    @property
    def report(self) -> str:
        return str(self)

    @property
    def reason(self) -> str:
        return self.error.reason

    @property
    def best(self) -> Any:
        return self.error.best

    @property
    def attempts(self) -> int:
        return self.error.attempts


def _report(node: LLMNode, st: _Node, reason: str, repeated: int | None,
            halt: str | None = None, detail: str | None = None, book=None) -> str:
    why = {
        "divergence": f"{node.patience} revision(s) in a row had fewer distinct ACKed cases "
                      f"than the best one so far (patience={node.patience})",
        "halted": f"halted before its next generator call by rt.halt({halt!r}); nothing was "
                  f"recorded for that call, and after rt.resume() the node generates again",
        "budget": f"the budget ran out ({node.budget})",
        "oscillation": f"the generator came back to revision {repeated}'s candidate",
        "no_progress": "two attempts in a row brought no new evidence",
        "validator_unstable": "a validator gave conflicting verdicts for one candidate and case",
        "unknown": "the evidence acceptance needs could not be obtained (UNKNOWN verdicts or "
                   "too few cases), and there is no NACK to learn from",
    }[reason]
    if detail:
        why = detail if reason == "oscillation" and repeated is None else f"{why}: {detail}"
    lines = [f"{st.label}: not accepted — {why}.",
             f"{st.spent_attempts} generator call(s) in this context; "
             f"{st.spent_tokens} tokens, cost {st.spent_cost:g}."]
    if book is not None and book.budget is not None and "runtime-wide" not in why:
        lines.append(_graph_figures(book) + ".")
    for a in st.attempts:
        head = f"  revision {a.revision}" if a.revision else "  (no candidate)"
        lines.append(f"{head} [{a.fingerprint or '-'}] {a.seconds * 1000:.0f} ms"
                     + (f", {a.tokens} tokens" if a.tokens else "")
                     + (f"; {a.outcome}" if a.outcome else "")
                     + (f"; {a.note}" if a.note else ""))
        if a.revision and a.revision in st.values:
            lines.append(f"    candidate: {_text(st.values[a.revision])}")
        for name in ("rationale", "hypothesis"):
            if getattr(a, name):
                lines.append(f"    {name}: {_text(getattr(a, name))}")
        if a.expect:
            lines.append(f"    expected to flip: {', '.join(a.expect)}")
        if a.patch is not None:
            lines.append(f"    patch: {_text(a.patch)}")
        if a.feedback:
            lines.append(f"    fed back: " + "; ".join(f"{v.case}" for v in a.feedback))
        for vid, v in a.verdicts:
            detail = ""
            if isinstance(v, NACK):
                detail = f" counterexample={v.counterexample!r}" + (f" ({v.message})" if v.message else "")
            elif isinstance(v, UNKNOWN):
                detail = f" ({v.reason})"
            lines.append(f"    {v.kind:<7} {vid} / {v.case}{detail}")
    lines.append("next step: " + _next_step(node, st, reason))
    return "\n".join(lines)


def _text(x: Any, limit: int = 160) -> str:
    """A candidate, rationale or patch on one line, truncated."""
    try:
        t = x if isinstance(x, str) else repr(x)
    except Exception:
        t = f"<a {type(x).__qualname__} whose repr() raises>"
    t = t.replace("\n", "\\n")
    return t if len(t) <= limit else t[:limit - 3] + "..."


def _next_step(node: LLMNode, st: _Node, reason: str) -> str:
    """What a user can do about a loop that stopped for ``reason``."""
    return {
        "budget": "raise the Budget (per node, or Runtime(budget=)) if the last revisions were "
                  "getting closer; otherwise improve the prompt or the feedback rendering",
        "oscillation": "the model returns to an answer already rejected: give it more "
                       "context in feedback, use a stronger model, or on_failure= to escalate",
        "no_progress": "two attempts brought no new evidence: check that the validators "
                       "report the failing cases with counterexamples",
        "divergence": "the revisions are getting worse: start from .best, or raise patience "
                      "if the task needs exploration",
        "validator_unstable": "fix the validator first: it judged one candidate both ways",
        "unknown": "a required validator could not decide (it raised, timed out, or gave no "
                   "verdict on a regression case): fix it, or pass recheck=",
        "halted": "call rt.resume() and demand the node again",
    }.get(reason, "see the verdicts above")
