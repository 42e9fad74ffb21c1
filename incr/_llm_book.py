"""incr.llm's bookkeeping on one runtime, ``rt.llm`` (internal): every node instance's state,
the rt.on_event subscribers, and the runtime-wide budgets (Runtime(budget=, pass_budget=)).

Invariants it keeps:
- a runtime has one _Bookkeeping, made at its first use (_book), holding every _Node of the
  runtime by Instance;
- the runtime-wide spend changes only under book.lock: a model call is claimed (_graph_take)
  before it starts, atomically against calls made ahead in worker threads, and what it spent
  is added where it ended (_graph_spent);
- book.listeners is replaced, never mutated, so _emit reads a tuple that no thread changes; a
  subscriber that raises is a RuntimeWarning and never changes what the loop does.
"""

from __future__ import annotations

import logging
import threading
import warnings
from typing import Any, Callable

from incr._core import Instance
from incr._llm_types import _DEFAULT_ATTEMPTS, Budget


class _Bookkeeping:
    """incr.llm's state on one runtime (rt.llm)."""

    def __init__(self):
        self.nodes: dict[Instance, _Node] = {}
        self.generations = 0
        self.validations = 0
        self.listeners: tuple = ()          # rt.on_event callbacks (replaced, never mutated)
        self.pass_open = False              # PassStarted announced, PassFinished not yet
        self.budget: Budget | None = None   # Runtime(budget=): every node together
        self.pass_budget: Budget | None = None  # Runtime(pass_budget=): per stabilize()
        self.pass_spent: list = [0, 0, 0.0, 0.0]  # calls, tokens, cost, seconds this pass
        self.on_failure: Callable | None = None   # Runtime(on_failure=): the default
        self.lock = threading.Lock()        # the runtime-wide spend (worker threads add to it)
        self.calls = 0
        self.tokens = 0
        self.cost = 0.0
        self.seconds = 0.0
        self.latest: dict = {}              # LLMNode -> (candidate, label): reuse="revalidate"
        self.spot: dict = {}                # Instance -> (rt.revision, monotonic) at acceptance
        self.halted: set = set()            # Instances whose loop stopped at rt.halt, until
                                            # the next operation after rt.resume() (spot_checks)
        self.audited: set = set()           # LLMNodes whose validators were compared with
                                            # the store's record of them


def _book(rt) -> _Bookkeeping:
    b = rt.llm
    if b is None:
        b = rt.llm = _Bookkeeping()
    return b


_log = logging.getLogger("incr.llm")


def _emit(book: _Bookkeeping, event: Any) -> None:
    """Tell every subscriber (and the ``incr.llm`` logger) about ``event``. A callback that
    raises is a RuntimeWarning; it never changes what the loop does."""
    if _log.isEnabledFor(logging.DEBUG):
        _log.debug("%s", event)
    for cb in book.listeners:
        try:
            cb(event)
        except Exception as e:
            warnings.warn(f"incr: an rt.on_event callback {cb!r} raised {type(e).__name__}: "
                          f"{e}; the loop went on", RuntimeWarning, stacklevel=2)


def _limit_over(b: Budget | None, calls: int, tokens: int, cost: float,
                seconds: float) -> str | None:
    if b is None:
        return None
    if (b.max_attempts is not _DEFAULT_ATTEMPTS and b.max_attempts is not None
            and calls >= b.max_attempts):
        return f"model calls {calls} of {b.max_attempts}"
    if b.max_tokens is not None and tokens >= b.max_tokens:
        return f"tokens {tokens} of {b.max_tokens}"
    if b.max_cost is not None and cost >= b.max_cost:
        return f"cost {cost:g} of {b.max_cost:g}"
    if b.max_seconds is not None and seconds >= b.max_seconds:
        return f"seconds in model calls {seconds:.3g} of {b.max_seconds:g}"
    return None


def _graph_over(book: _Bookkeeping) -> str | None:
    """Which runtime-wide limit (Runtime(budget=), or Runtime(pass_budget=) for the current
    stabilization) is used up, or None."""
    over = _limit_over(book.budget, book.calls, book.tokens, book.cost, book.seconds)
    if over is None:
        over = _limit_over(book.pass_budget, *book.pass_spent)
        if over is not None:
            over += " in this stabilization"
    return over


def _graph_take(book: _Bookkeeping) -> None:
    """Claim one model call from the runtime-wide budgets, atomically (calls made ahead in
    worker threads race here): raises _GraphBudget when one is used up."""
    if book.budget is None and book.pass_budget is None:
        return
    with book.lock:
        over = _graph_over(book)
        if over is not None:
            raise _GraphBudget(over)
        book.calls += 1
        book.pass_spent[0] += 1


def _graph_spent(book: _Bookkeeping, tokens: int, cost: float, seconds: float) -> None:
    if book.budget is None and book.pass_budget is None:
        return
    with book.lock:
        book.tokens += tokens
        book.cost += cost
        book.seconds += seconds
        p = book.pass_spent
        p[1] += tokens
        p[2] += cost
        p[3] += seconds


def _graph_figures(book: _Bookkeeping) -> str:
    text = (f"runtime-wide: {book.calls} model call(s), {book.tokens} tokens, cost "
            f"{book.cost:g}, {book.seconds:.3g} s in model calls")
    if book.budget is not None:
        text += f", of {book.budget}"
    if book.pass_budget is not None:
        c, t, k, s = book.pass_spent
        text += (f"; this stabilization: {c} call(s), {t} tokens, cost {k:g}, {s:.3g} s, of "
                 f"{book.pass_budget}")
    return text


class _GraphBudget(Exception):
    """Internal: the runtime-wide budget (Runtime(budget=)) is used up."""
