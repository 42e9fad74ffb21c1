"""LLM nodes: memoized generators that become stable only under validator evidence.

An LLM node is a cell whose function is a control loop around a generator (the model call)
and validators (checks outside the model). It lives in the same trace as every other cell:
what its generator and validators read are its dependencies, its accepted candidate is its
value, and its readers are withdrawn through the same propagation as after an input change.

The loop, per node instance (``_Loop.run``):

1. If it holds a candidate, re-read what the last run read. Something changed: open a new
   evidence epoch (verdicts gathered under the old context become history; the budget starts
   again) and re-validate the current candidate; accepted -> stable, no generation.
   Nothing changed (it runs because a NACK withdrew the candidate, or it failed before):
   decide from the ledger as it stands.
2. Otherwise, or when the current candidate is rejected: generate (``previous`` = the last
   candidate, ``feedback`` = the NACKs that apply to it, regression cases included), run the
   validators and rechecks on the new revision, decide. Every stop condition is computed here,
   outside the model: budget, oscillation (a fingerprint seen before), no progress (two
   attempts without new evidence), validator instability (ACK and NACK for one candidate and
   case), unknown (no NACK to learn from, and not enough ACKs).

The ledger keys every verdict by (validator id, validator version, case, candidate revision):
a verdict for another revision is history and never moves the current status; the same
verdict twice counts once.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import operator
import threading
import time
import warnings
from typing import Any, Callable, Iterable

import attrs

from incr import keys as _keys
from incr import _core
from incr._core import EQUAL, Cell, Instance, current
from incr import _aio
from incr import events
from incr.errors import IncrError, NotAccepted, Reject, _Deferred, _OutOfTime, _Suspend

__all__ = ["ACK", "NACK", "UNKNOWN", "Acceptance", "Budget", "Candidate", "LLMNode",
           "NodeState", "Validator", "effect", "llm", "validator"]


# --- verdicts --------------------------------------------------------------------------------


def _text_field(inst, attribute, value):
    """A verdict's text fields (``case``, ``message``, ``reason``) are checked when it is made:
    ``TypeError`` for a value that is not a ``str`` or text that cannot be stored as UTF-8
    (the same error ``rt.nack`` gives). (Payloads -- ``evidence``, ``counterexample`` -- are checked when the
    verdict is recorded: one incr cannot keep becomes an UNKNOWN saying why.)"""
    if not isinstance(value, str):
        raise TypeError(f"incr.{type(inst).__name__}: {attribute.name} must be "
                        f"{_TEXTS[attribute.name]}, got {_short(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise TypeError(f"incr.{type(inst).__name__}: {attribute.name} must be valid text "
                         f"(it is stored as UTF-8), got {_short(value)}: {e}") from None


@attrs.frozen
class ACK:
    """The candidate passed the check ``case``."""
    case: str = attrs.field(validator=_text_field)
    evidence: Any = None
    kind = "ACK"


@attrs.frozen
class NACK:
    """The candidate failed the check ``case``; ``counterexample`` shows how."""
    case: str = attrs.field(validator=_text_field)
    counterexample: Any = None
    message: str = attrs.field(default="", validator=_text_field)
    kind = "NACK"


@attrs.frozen
class UNKNOWN:
    """Nothing could be decided for ``case`` (the validator crashed, timed out, ...)."""
    case: str = attrs.field(validator=_text_field)
    reason: str = attrs.field(default="", validator=_text_field)
    kind = "UNKNOWN"


_VERDICTS = (ACK, NACK, UNKNOWN)
_NOTHING = object()   # no outcome (of a call run ahead)


# --- async functions: refused (this version runs sync generators and validators only) -------


def _async_kind(fn: Any) -> str | None:
    """What makes ``fn`` async ("a coroutine function", "an async generator function"), or
    None for a sync callable. An object whose ``__call__`` is async counts; a sync wrapper of
    an async function (one that runs it with asyncio.run) does not."""
    for f in (fn, getattr(type(fn), "__call__", None)):
        if f is None:
            continue
        if inspect.iscoroutinefunction(f):
            return "a coroutine function (async def)"
        if inspect.isasyncgenfunction(f):
            return "an async generator function (async def with yield)"
    return None


def _refuse_async(fn: Any, what: str, qual: str) -> None:
    kind = _async_kind(fn)
    if kind is not None:
        raise TypeError(f"{what} {qual!r} is {kind}; it must be a plain def (it may run a "
                        f"coroutine to completion inside, e.g. with asyncio.run). A coroutine "
                        f"is never a candidate or a verdict.")


def _is_async(fn: Any, what: str, qual: str) -> bool:
    """True for a coroutine function (awaited by incr: on the running loop, or on a loop of
    its own from sync code); TypeError for an async generator function."""
    kind = _async_kind(fn)
    if kind is None:
        return False
    if "generator" in kind:
        raise TypeError(f"{what} {qual!r} is {kind}: it must return its result (a candidate, "
                        f"or verdicts), not yield it asynchronously; make it an async def "
                        f"that returns a list, or a plain def.")
    _core._note_async()
    return True


def _awaitable_problem(x: Any) -> str | None:
    """If ``x`` is something to await (a coroutine, a Future, any object with __await__),
    close it when it is a coroutine (so that Python does not warn it was never awaited) and
    say what it is; else None."""
    if not inspect.isawaitable(x):
        return None
    what = "a coroutine" if inspect.iscoroutine(x) else f"an awaitable ({type(x).__qualname__})"
    close = getattr(x, "close", None) if inspect.iscoroutine(x) else None
    if close is not None:
        try:
            close()
        except Exception:
            pass
    return what


def _no_awaitable(node: Any, label: str, out: Any) -> None:
    """A generator's result must be a candidate: a TypeError naming the generator if it is
    something to await (a coroutine is closed first)."""
    what = _awaitable_problem(out.value if isinstance(out, Candidate) else out)
    if what is not None:
        qual = getattr(node.gen, "__qualname__", repr(node.gen))
        raise TypeError(f"incr.llm {qual!r} returned {what} for {label}, not a candidate: "
                        f"the generator is sync but returned an awaitable (it was closed, "
                        f"never awaited); await it inside the generator (e.g. with "
                        f"asyncio.run) or return the value. A coroutine is never a candidate.")


def _spend_check(name: str, value: Any) -> None:
    """incr.Candidate's tokens (an int >= 0) and cost (a finite number >= 0): what budgets
    add up, so a negative or NaN one would refill or switch off a budget."""
    import math
    import numbers
    if name == "tokens":
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0:
            raise ValueError(f"incr.Candidate: tokens must be an int >= 0 (the tokens the "
                             f"model call used), got {_short(value)}")
    elif not isinstance(value, numbers.Real) or isinstance(value, bool) or \
            not math.isfinite(value) or value < 0:
        raise ValueError(f"incr.Candidate: cost must be a finite number >= 0 (what the model "
                         f"call cost), got {_short(value)}")


@attrs.frozen
class Candidate:
    """What a generator may return instead of a bare value: its cost, and a reflection
    record -- why it is what it is (``rationale``), the falsifiable cause it acts on
    (``hypothesis``), the edit it made (``patch``: with ``@incr.llm(patch=True)`` the patch
    *is* the answer, applied to ``previous`` by the runtime) and the checks it expects to
    flip (``expect``: case names). All of it is kept per attempt (``rt.state(...).attempts``,
    ``NotAccepted.report``, ``incr inspect``, the store)."""
    value: Any
    tokens: int = attrs.field(default=0, validator=lambda i, a, v: _spend_check("tokens", v))
    cost: float = attrs.field(default=0.0, validator=lambda i, a, v: _spend_check("cost", v))
    rationale: str = ""
    hypothesis: str = ""
    patch: Any = None
    expect: tuple = attrs.field(default=(), converter=lambda x: (x,) if isinstance(x, str)
                                else tuple(x))


def _positive(kind):
    def check(inst, attribute, value):
        # (NaN is no number here: every comparison with it is False, so a NaN limit would
        # never trip -- the budget silently off)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)
                                  or value != value or value <= 0):
            raise ValueError(f"{type(inst).__name__}: {attribute.name} must be a positive "
                             f"{kind.__name__ if isinstance(kind, type) else 'number'} or "
                             f"None, got {value!r}")
    return check


class _DefaultAttempts(int):
    """The default max_attempts (5), told apart from an explicit 5: as a runtime-wide budget
    (``Runtime(budget=...)``), only an explicit max_attempts bounds the model calls."""

    def __repr__(self):
        return "5"


_DEFAULT_ATTEMPTS = _DefaultAttempts(5)


def _nonnegative_int(inst, attribute, value):
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                              or value < 0):
        raise ValueError(f"Budget: {attribute.name} must be an int >= 0 or None, got "
                         f"{value!r}")


@attrs.frozen
class Budget:
    """How much one node may spend per context (it starts again when a dependency changes);
    as ``Runtime(budget=...)``, how much every node of the runtime may spend together.

    ``cooldown``: seconds between two model calls of one node. ``max_withdrawals``
    (hysteresis; default None: off): a node withdrawn (NACKed from outside after acceptance)
    more often than this in one context stays withdrawn until its context changes
    (``NotAccepted(reason="oscillation")``), whatever evidence comes meanwhile."""
    max_attempts: int = attrs.field(default=_DEFAULT_ATTEMPTS, validator=_positive(int))
    max_seconds: float | None = attrs.field(default=None, validator=_positive((int, float)))
    max_tokens: int | None = attrs.field(default=None, validator=_positive(int))
    max_cost: float | None = attrs.field(default=None, validator=_positive((int, float)))
    cooldown: float | None = attrs.field(default=None, validator=_positive((int, float)))
    max_withdrawals: int | None = attrs.field(default=None, validator=_nonnegative_int)


def _required(r: Any) -> tuple | None:
    """``Acceptance(required=)``: None (every validator) or an iterable of validators (or their
    ids); anything else is a TypeError naming the argument."""
    if r is None:
        return None
    if isinstance(r, (str, bytes)) or not isinstance(r, Iterable):
        raise TypeError(f"incr.Acceptance: required must be None or an iterable of validators "
                        f"(e.g. required=[sql_tests]), got {_short(r)}")
    return tuple(r)


@attrs.frozen
class Acceptance:
    """The current candidate is accepted when every required validator (default: all) gave
    it at least one ACK and no NACK and no UNKNOWN, and it has at least ``min_cases``
    distinct ACKed (validator, case) pairs."""
    required: tuple | None = attrs.field(default=None, converter=_required)
    min_cases: int = 0

    def __attrs_post_init__(self):
        if not isinstance(self.min_cases, int) or self.min_cases < 0:
            raise ValueError(f"Acceptance: min_cases must be an int >= 0, got {self.min_cases!r}")


# --- validators ------------------------------------------------------------------------------


class Validator:
    """A check outside the model. Create with ``@incr.validator(version=..., timeout=...)``.

    Called as ``fn(candidate, *node_args, **node_kwargs)``; returns or yields verdicts. An
    exception or a timeout is UNKNOWN, never NACK. ``raise incr.Reject(other_node, ...)``
    inside it blames another node's candidate instead.
    """

    def __init__(self, fn: Callable, version: Any = None, timeout: float | None = None):
        if not callable(fn):
            raise TypeError(f"incr.validator needs a function, got {fn!r}")
        self.is_async = _is_async(fn, "incr.validator", getattr(fn, "__qualname__", repr(fn)))
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
            raise ValueError(f"incr.validator {fn.__qualname__}: timeout must be a positive "
                             f"number of seconds or None, got {timeout!r}")
        if version is not None and (type(version) is bool
                                    or not isinstance(version, (str, int))):
            # as for @incr.cell (Cell.__init__): the version goes into every context key of
            # the nodes it validates, across processes; an object's repr differs per process
            raise TypeError(f"incr.validator {fn.__qualname__}: version must be a str or an "
                            f"int (it names this validator in the store, across processes), "
                            f"got {version!r} ({type(version).__qualname__})")
        self.fn = fn
        self.id = f"{fn.__module__}.{fn.__qualname__}"
        self.version = str(version) if version is not None else \
            "c:" + _keys.code_fingerprint(fn).hex()[:16]
        self.timeout = timeout
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __repr__(self):
        return f"<incr.validator {self.id} version {self.version}>"


def validator(fn=None, /, *, version=None, timeout=None):
    """Make ``fn`` a validator (bare, or with ``version=`` and ``timeout=`` seconds)."""
    if fn is None:
        return lambda f: Validator(f, version, timeout)
    return Validator(fn, version, timeout)


# --- node state ------------------------------------------------------------------------------


@attrs.define
class NodeState:
    """What ``rt.state(node, *args)`` reports about one LLM node instance."""
    candidate: Any = None
    revision: int = 0
    context_key: str = ""
    dependency_revisions: dict = attrs.Factory(dict)
    checks: dict = attrs.Factory(dict)
    status: str = "active"
    attempts: list = attrs.Factory(list)


@attrs.define(eq=False)
class _Attempt:
    revision: int
    fingerprint: str
    feedback: tuple
    verdicts: list
    tokens: int
    cost: float
    seconds: float
    note: str = ""
    # the reflection record (incr.Candidate's fields) and what became of the attempt
    rationale: str = ""
    hypothesis: str = ""
    patch: Any = None
    expect: tuple = ()
    outcome: str = ""         # "accepted", "rejected", "reverted", "stopped: <reason>", ""


@attrs.define(eq=False)
class _Node:
    """The bookkeeping of one LLM node instance (internal)."""
    label: str
    candidate: Any = None
    has_candidate: bool = False
    revision: int = 0
    status: str = "active"
    ledger: dict = attrs.Factory(dict)      # (vid, vver, case, rev) -> [verdicts, distinct]
    history: list = attrs.Factory(list)     # ((vid, vver, case, rev), verdict, epoch) archived
    regressions: list = attrs.Factory(list) # NACKs with counterexamples, oldest first
    attempts: list = attrs.Factory(list)    # _Attempt, every epoch
    fingerprints: dict = attrs.Factory(dict)  # candidate fingerprint -> revision
    values: dict = attrs.Factory(dict)      # revision -> candidate
    epoch: int = 0
    spent_attempts: int = 0
    spent_tokens: int = 0
    spent_cost: float = 0.0
    started: float = 0.0
    evidence: set = attrs.Factory(set)      # evidence items seen this epoch
    stale_streak: int = 0
    snapshot: list | None = None            # (node, changed_at) of everything the run read
    events: int = 0                         # verdicts from outside (rt.nack/ack, Reject)
    failed: NotAccepted | None = None
    failed_events: int = 0
    rejections: int = 0
    context_key: str = ""
    dependency_revisions: dict = attrs.Factory(dict)
    refs: list | None = None                # snapshot as store references (after a restore)
    prefetched: dict = attrs.Factory(dict)  # call key -> (outcome, reads) run ahead (stabilize)
    pending: Any = False                    # what a stabilize pass set aside mid-loop:
                                            # "generate", "judge" or "revalidate"
    withdrawn: set = attrs.Factory(set)     # fingerprints of candidates NACKed from outside
    # what the evidence rests on, in this process (for Runtime._check, invariant I7): ledger
    # key -> ((node, changed_at), ...) read by the run before that verdict was recorded; and
    # the same for the generation of the current candidate. Not stored.
    made_under: dict = attrs.Factory(dict)
    generated_under: tuple = ()
    # control (seed 002) and repair (seed 001)
    regression_src: list = attrs.Factory(list)  # the verdict source of each regression case
    base: int = 0                   # the revision the next generation builds on (0: current)
    below: int = 0                  # revisions in a row below the best one's distinct ACKs
    withdrawals: int = 0            # withdrawals after acceptance, this context
    damped: bool = False            # withdrawn too often: stays failed until the context moves
    escalated: bool = False         # on_failure was asked in this budget
    last_call: float = 0.0          # time.monotonic() at the end of the last model call
    spot_due: bool = False          # recheck_every: re-validate at the next run
    warned: set = attrs.Factory(set)  # monitors that warned in this budget
    near: int = 0                   # the revision the new candidate equals after normalize
    unvalidated: bool = False       # as saved: nothing validated the candidate (incr inspect)
    pass_cut: bool = False          # stopped by Runtime(pass_budget=): the next pass goes on
    patch_nack: Any = None          # patch mode: why the last patch did not apply (fed back
                                    # until the next candidate)


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


def configure(rt, budget, on_failure, pass_budget=None) -> None:
    """Runtime(budget=, pass_budget=, on_failure=): control over every LLM node of ``rt``."""
    for name, b in (("budget", budget), ("pass_budget", pass_budget)):
        if b is not None and not isinstance(b, Budget):
            raise TypeError(f"Runtime: {name} must be an incr.Budget, got {_short(b)}")
    if on_failure is not None and not callable(on_failure):
        raise TypeError(f"Runtime: on_failure must be callable(report) -> candidate | None, "
                        f"got {_short(on_failure)}")
    if on_failure is not None:
        _refuse_async(on_failure, "Runtime: on_failure=",
                      getattr(on_failure, "__qualname__", repr(on_failure)))
    b = _book(rt)
    b.budget, b.on_failure, b.pass_budget = budget, on_failure, pass_budget


def pass_reset(rt) -> None:
    """A stabilize() (or astabilize()) begins: Runtime(pass_budget=) starts afresh."""
    book = rt.llm
    with book.lock:
        book.pass_spent = [0, 0, 0.0, 0.0]


def on_event(rt, callback) -> Callable[[], None]:
    """rt.on_event(callback): subscribe; returns the function that unsubscribes."""
    if not callable(callback):
        raise TypeError(f"rt.on_event: callback must be callable(event), got {_short(callback)}")
    _refuse_async(callback, "rt.on_event: callback",
                  getattr(callback, "__qualname__", repr(callback)))
    b = _book(rt)
    with b.lock:
        b.listeners = b.listeners + (callback,)

    def unsubscribe() -> None:
        with b.lock:
            b.listeners = tuple(c for c in b.listeners if c is not callback)
    return unsubscribe


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


def pass_started(rt) -> None:
    """A stabilize pass begins (events.PassStarted; the core calls it when someone listens).
    One stabilization announces one start: the internal passes of one that stops for async
    work and passes again (incr._aio.astabilize) announce none after the first."""
    book = rt.llm
    if book.pass_open:
        return
    book.pass_open = True
    _emit(book, events.PassStarted("stabilize", rt.revision))


def stabilization_begins(rt) -> None:
    """rt.stabilize() / rt.astabilize() begins: its first pass announces itself (an earlier
    stabilization that raised before announcing its end leaves nothing open)."""
    if rt.llm is not None:
        rt.llm.pass_open = False


def pass_finished(rt, report, errors) -> None:
    rt.llm.pass_open = False
    err = ""
    if errors:
        e = errors[0][1]
        err = f"{type(e).__name__}: {e}"
    _emit(rt.llm, events.PassFinished("stabilize", rt.revision, tuple(report.recomputed),
                                      report.seconds, err))


def spot_checks(rt) -> None:
    """Before a stabilization (or a top-level demand): withdraw every stable node with
    recheck_every= whose spot check is due, so that the pass re-runs its validators on its
    accepted candidate; and, after rt.resume(), make stale whatever met a node halted before
    it (Runtime._halt_lifted)."""
    book = rt.llm
    if book.halted and rt.halt_reason is None:
        # rt.resume() came since these stopped at the halt: what met them is stale
        if rt._halt_lifted(list(book.halted)):
            book.halted = set()
    now = time.monotonic()
    for inst, (rev, t) in list(book.spot.items()):
        st = book.nodes.get(inst)
        every = getattr(inst.cell, "recheck_every", None)
        if st is None or every is None or st.status != "stable":
            book.spot.pop(inst, None)
            continue
        kind, n = every
        if (kind == "revisions" and rt.revision - rev >= n) or \
                (kind == "seconds" and now - t >= n):
            book.spot[inst] = (rt.revision, now)
            st.spot_due = True
            rt._invalidate(inst)


def _normal(node, value: Any) -> Any:
    """What repetition compares: ``normalize(value)``; by default, text with its whitespace
    and case folded, anything else as it is."""
    if node.normalize is not None:
        return node.normalize(value)
    if isinstance(value, str):
        return " ".join(value.split()).casefold()
    return value


def _repeat_fp(node, value: Any) -> str:
    try:
        return _fingerprint(_normal(node, value))
    except Exception:       # a normalize that raises: the candidate as it is
        return _fingerprint(value)


def _fingerprint(value: Any) -> str:
    try:
        return _keys.digest("llm", _keys.encode(value)).hex()
    except Exception:       # TypeError; or a registered type's encoder that fails
        return "r:" + _keys.digest("llm", repr(value).encode()).hex()


def _cex_key(v: NACK) -> str:
    return _fingerprint([v.case, _safe(v.counterexample), v.message])


def _safe(x: Any) -> Any:
    try:
        _keys.encode(x)
        return x
    except Exception:
        return repr(x)


# What a verdict may hold. Its texts (case, message, reason) are stored and fed back as they
# are: str, valid UTF-8. Its payload (counterexample, evidence) is any value incr's codec
# encodes, or else any value with a repr(), which is what a store keeps of it.
_TEXTS = {"case": "a str naming the check", "message": "a str", "reason": "a str"}


def _short(x: Any) -> str:
    try:
        r = repr(x)
    except Exception:
        return f"a {type(x).__qualname__} whose repr() raises"
    return (r if len(r) <= 60 else r[:57] + "...") + f" ({type(x).__qualname__})"


def _field_problem(name: str, x: Any) -> str | None:
    """Why ``x`` cannot be the verdict field ``name``, or None."""
    if name in _TEXTS:
        if not isinstance(x, str):
            return f"{name} must be {_TEXTS[name]}, got {_short(x)}"
        try:
            x.encode("utf-8")
        except UnicodeEncodeError as e:
            return f"{name} must be valid text (it is stored as UTF-8), got {_short(x)}: {e}"
        return None
    try:
        _keys.encode(x)
        return None
    except Exception:       # TypeError; or a registered type's encoder that fails
        pass
    try:
        repr(x)
        return None
    except Exception as e:
        return (f"{name} is {_short(x)}: incr's codec cannot encode it and its repr() raised "
                f"{type(e).__name__}: {e}; pass a value incr encodes (None, bool, int, float, "
                f"str, bytes, tuple, list, dict with str keys, frozenset, registered types) or "
                f"one with a working repr() (a store keeps that repr)")


def _verdict_problem(v: Any) -> str | None:
    """Why ``v`` (an ACK, NACK or UNKNOWN) cannot be recorded, or None."""
    for name in ("case",) + tuple(f for f in ("counterexample", "evidence", "message",
                                              "reason") if hasattr(v, f)):
        p = _field_problem(name, getattr(v, name))
        if p is not None:
            return p
    return None


def _usable(v: Any, who: str) -> Any:
    """``v`` if it can be recorded; otherwise an UNKNOWN that says why (a validator's verdict
    that incr cannot keep never crashes the loop, and never counts as ACK or NACK)."""
    p = _verdict_problem(v)
    if p is None:
        return v
    case = v.case if isinstance(v.case, str) and _field_problem("case", v.case) is None else "*"
    return UNKNOWN(case, f"{who} gave an unusable {v.kind}: {p}")


# --- the node --------------------------------------------------------------------------------

_TRANSIENT_NAMES = {"RateLimitError", "APIConnectionError", "APITimeoutError",
                    "InternalServerError", "ServiceUnavailableError", "Timeout"}


def _transient(e: BaseException) -> bool:
    """A rate-limit or transport failure of the generator: retried, never fed back."""
    if isinstance(e, (ConnectionError, TimeoutError)):
        return True
    if type(e).__name__ in _TRANSIENT_NAMES:
        return True
    return getattr(e, "status_code", None) in (408, 409, 429, 500, 502, 503, 504)


class LLMNode(Cell):
    """A memoized generator whose value is its accepted candidate. Create with ``@incr.llm``."""

    def __init__(self, gen: Callable, *, validators=(), accept=None, budget=None,
                 version=None, recheck=None, backoff: float = 0.5, normalize=None,
                 patience: int = 2, patch: bool = False, apply=None, on_failure=None,
                 recheck_every=None, reuse=None):
        if not callable(gen):
            raise TypeError(f"incr.llm needs a function, got {gen!r}")
        qual = getattr(gen, "__qualname__", repr(gen))
        self.gen_is_async = _is_async(gen, "incr.llm", qual)
        if isinstance(validators, Validator):
            validators = (validators,)
        try:
            validators = tuple(validators)
        except TypeError:
            raise TypeError(f"incr.llm {qual}: validators must be a sequence of @incr.validator "
                            f"functions, got {validators!r}") from None
        for v in validators:
            if not isinstance(v, Validator):
                raise TypeError(f"incr.llm {qual}: validators must be made with "
                                f"@incr.validator, got {v!r}")
        if accept is None:
            accept = Acceptance()
        if not isinstance(accept, Acceptance):
            raise TypeError(f"incr.llm {qual}: accept must be an incr.Acceptance, got {accept!r}")
        if accept.required is not None:
            for r in accept.required:
                if r not in validators:
                    raise ValueError(f"incr.llm {qual}: required validator {r!r} is not "
                                     f"among its validators")
        if budget is None:
            budget = Budget()
        if not isinstance(budget, Budget):
            raise TypeError(f"incr.llm {qual}: budget must be an incr.Budget, got {budget!r}")
        if recheck is not None and not callable(recheck):
            raise TypeError(f"incr.llm {qual}: recheck must be callable, got {recheck!r}")
        if recheck is not None:
            _refuse_async(recheck, f"incr.llm {qual}: recheck=",
                          getattr(recheck, "__qualname__", repr(recheck)))
        for name, fn in (("normalize", normalize), ("apply", apply),
                         ("on_failure", on_failure)):
            if fn is not None:
                if not callable(fn):
                    raise TypeError(f"incr.llm {qual}: {name} must be callable, got "
                                    f"{_short(fn)}")
                _refuse_async(fn, f"incr.llm {qual}: {name}=",
                              getattr(fn, "__qualname__", repr(fn)))
        if not isinstance(patience, int) or isinstance(patience, bool) or patience < 1:
            raise ValueError(f"incr.llm {qual}: patience must be an int >= 1 (attempts in a "
                             f"row below the best revision before it stops), got {patience!r}")
        if not isinstance(patch, bool):
            raise TypeError(f"incr.llm {qual}: patch must be True or False (or pass "
                            f"apply=callable(previous, patch)), got {_short(patch)}")
        if recheck_every is not None:
            ok = (isinstance(recheck_every, tuple) and len(recheck_every) == 2
                  and recheck_every[0] in ("revisions", "seconds")
                  and isinstance(recheck_every[1], (int, float))
                  and not isinstance(recheck_every[1], bool) and recheck_every[1] > 0
                  and (recheck_every[0] == "seconds" or isinstance(recheck_every[1], int)))
            if not ok:
                raise ValueError(f"incr.llm {qual}: recheck_every must be ('revisions', N) "
                                 f"with an int N > 0 or ('seconds', S) with S > 0, got "
                                 f"{recheck_every!r}")
            if not validators and recheck is None:
                raise ValueError(f"incr.llm {qual}: recheck_every= needs validators (or "
                                 f"recheck=) to re-run on the accepted candidate")
        if reuse not in (None, "revalidate"):
            raise ValueError(f"incr.llm {qual}: reuse must be None or 'revalidate', got "
                             f"{reuse!r}")
        sig = inspect.signature(gen)
        for name in ("previous", "feedback"):
            p = sig.parameters.get(name)
            if p is None or p.kind is not p.KEYWORD_ONLY:
                raise TypeError(f"incr.llm {qual}: the generator must take the keyword-only "
                                f"parameters previous= and feedback= "
                                f"(def {gen.__name__}(..., *, previous=None, feedback=()))")
        params = [p for p in sig.parameters.values() if p.name not in ("previous", "feedback")]
        node = self

        def loop(*args, **kwargs):
            return _Loop(node, args, kwargs).run()

        functools.update_wrapper(loop, gen)
        loop.__signature__ = sig.replace(parameters=params)
        del loop.__wrapped__
        self.gen = gen
        self.validators = validators
        self.accept = accept
        self.budget = budget
        self.recheck = recheck
        self.backoff = backoff
        self.normalize = normalize
        self.patience = patience
        self.patch = patch or apply is not None
        self.apply = apply
        self.on_failure = on_failure
        self.recheck_every = recheck_every
        self.reuse = reuse
        super().__init__(loop, version=version, cutoff=EQUAL, local=True)
        self.is_llm = True
        self.awaited = self.gen_is_async or any(v.is_async for v in validators)
        _core._enable_run_ahead()    # passes now gather generator calls to make concurrently
        # identity across processes: the definition and every validator's id and version
        if version is not None:
            base, exact = f"v:{version}", True
        else:
            cfp, exact = _keys.closure_fingerprint(gen)
            base = "c:" + _keys.digest("llm", _keys.code_fingerprint(gen) + cfp).hex()[2:18]
        vals = ",".join(f"{v.id}@{v.version}" for v in validators)
        self._incr_ident = f"{self.name}@llm:{base}|{_keys.digest('validator', vals.encode()).hex()[2:18]}"
        self._incr_exact = exact
        self.validator_key = vals
        self._audit_ident = f"{self.name}@llm:{base}"   # the definition, validators aside

    def __repr__(self):
        return f"<incr.llm {self.name}>"


def llm(fn=None, /, *, validators=(), accept=None, budget=None, version=None, recheck=None,
        normalize=None, patience=2, patch=False, apply=None, on_failure=None,
        recheck_every=None, reuse=None):
    """Make a generator an LLM node: ``fn(*args, previous=None, feedback=())`` returns a
    candidate (or an ``incr.Candidate``); calling the node returns an accepted candidate or
    raises ``incr.NotAccepted``.

    Control (docs/llm.md): ``normalize(candidate) -> hashable`` for repetition (default for
    text: whitespace and case folded); ``patience``: revisions in a row below the best one's
    distinct ACKs before ``NotAccepted(reason="divergence")``; ``patch=True`` (or
    ``apply=callable(previous, patch) -> candidate``): the generator answers a retry with a
    patch against ``previous``; ``on_failure(report) -> candidate | None`` when the loop ends
    without acceptance; ``recheck_every=("revisions", N) | ("seconds", S)``: spot checks of
    the accepted candidate; ``reuse="revalidate"``: a new instance first validates the most
    recent instance's accepted candidate."""
    def make(f):
        return LLMNode(f, validators=validators, accept=accept, budget=budget,
                       version=version, recheck=recheck, normalize=normalize,
                       patience=patience, patch=patch, apply=apply, on_failure=on_failure,
                       recheck_every=recheck_every, reuse=reuse)
    return make if fn is None else make(fn)


class _Loop:
    """One run of a node instance's control loop, inside its frame (internal)."""

    def __init__(self, node: LLMNode, args: tuple, kwargs: dict):
        self.node = node
        self._args = args         # this run's copy (the core's): never handed out itself
        self._kwargs = kwargs
        self.rt = current()
        self.book = _book(self.rt)
        inst = self.rt._running()
        if node not in self.book.audited:
            self.book.audited.add(node)
            _audit(self.rt, node)
        st = _node_of(self.rt, inst, create=True)
        self.inst = inst
        self.st = st
        self.cut_short = False    # stopped at a generator call: halted, or the call raised
        self.began = False        # the model call of this attempt has started (see start())
        self.ran_for = None       # seconds of a call made ahead (its own, not the replay's)
        self.ahead_seconds = None
        self.replayed = False     # the call's outcome was made ahead (a worker or a task)
        self.ticket = None        # the _Ticket of the call made here
        # until the run has switched over (a new context taken in, or where the last pass
        # stopped resumed: see _settle), an interrupt undoes what it did to the node's state
        # (undo: _switch_state at the start) and the snapshot stays, as if it had not run
        self.settled = False
        self.undo = None

    # every call this run makes with the node's arguments (each generator call, each
    # validator and recheck call) gets its own copy, made as the core makes one for each
    # run of a cell (keys.own_args): what one call does to them, no other call sees
    @property
    def args(self) -> tuple:
        own = _keys.own_args(self._args)
        return self._args if own is None else own

    @property
    def kwargs(self) -> dict:
        kw = self._kwargs
        own = _keys.own_args(tuple(kw.values())) if kw else None
        return kw if own is None else dict(zip(kw, own))

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> Any:
        st = self.st
        deferred = False
        taken_in = False      # every change since the last run has been looked at
        unrun = False         # interrupted before it settled: undone, nothing kept
        unread = False        # a dependency raised while re-reading: nothing kept
        self.undo = _switch_state(st)
        try:
            first = st.snapshot is None and st.refs is None
            changed = first or self._reread()
            taken_in = True
            # recheck_every: a spot check re-validates the accepted candidate as a change of
            # context does (its earlier verdicts become history: the world may have moved)
            spot, st.spot_due = st.spot_due and st.has_candidate and st.failed is None, False
            if changed or spot:
                st.pending = False
                self._new_epoch()
                if not st.has_candidate and self._reusable() is not None:
                    # reuse="revalidate": the most recent instance's accepted candidate is
                    # this instance's first, accepted only on its own evidence
                    cand, source = self._reusable()
                    self._adopt(cand, f"reused from {source}, re-validated here (no model "
                                      f"call)")
                    self._settle("judge")
                    if self._judge():
                        return self._stable()
                    return self._loop_on()
                if st.has_candidate:
                    if self._vacuous() and not self._withdrawn_now():
                        # no evidence could re-accept the old candidate in the new context:
                        # the first candidate of this context is the one accepted
                        return self._loop_on()
                    # the current candidate is this context's first: it must not come back
                    st.fingerprints[_fingerprint(st.candidate)] = st.revision
                    st.fingerprints["n:" + _repeat_fp(self.node, st.candidate)] = st.revision
                    self._settle("revalidate")
                    self._validate(resume="revalidate")
            elif st.pending == "generate":
                # the last pass set a generator call aside: it goes on where it stopped
                return self._loop_on()
            elif st.pending == "judge":
                # the last pass set the validation of a new candidate aside
                self._settle("judge")
                if self._judge():
                    return self._stable()
                return self._loop_on()
            elif st.pending == "revalidate":
                # the last pass set the re-validation of the current candidate aside
                self._settle("revalidate")
                self._validate()
            elif st.damped and st.failed is not None:
                # withdrawn too often in this context: it stays withdrawn until the context
                # changes, whatever comes from outside meanwhile
                f = st.failed
                raise NotAccepted(f.label, f.reason, f.report, f.best, f.attempts)
            elif st.failed is None and self.node.budget.max_withdrawals is not None and \
                    st.withdrawals > self.node.budget.max_withdrawals:
                st.damped = True
                self._fail("oscillation", detail=(
                    f"withdrawn {st.withdrawals} times after acceptance in this context "
                    f"(Budget(max_withdrawals={self.node.budget.max_withdrawals})); it stays "
                    f"withdrawn until its context changes"))
            elif st.failed is not None and st.pass_cut:
                # stopped by the budget of the last stabilization: this one goes on, within
                # the node's own budget
                st.pass_cut = False
                st.failed = None
                st.status = "active"
            elif st.failed is not None and st.events == st.failed_events:
                # nothing changed since it gave up: the same answer, no model call
                f = st.failed
                raise NotAccepted(f.label, f.reason, f.report, f.best, f.attempts)
            elif st.failed is not None:
                # it gave up, and new evidence came from outside: a fresh budget
                self._fresh_budget()
            if st.has_candidate:
                stop = self._decide()
                if stop is None:
                    return self._stable()
                if stop != "retry":
                    self._fail(stop)
            return self._loop_on()
        except _Escalated as e:
            return e.value
        except BaseException as e:
            if not self.settled and not isinstance(e, Exception):
                # Ctrl-C (or a deferral) while the run switches over to a new context (or
                # decides where to go on): the switch is undone as a whole -- the next run
                # sees the same change and makes it again. Left half made, the node would
                # take the old candidate as re-validated in the new context.
                _put_back(st, self.undo)
                unrun = True
            elif isinstance(e, _Deferred):
                deferred = True
            elif not taken_in and isinstance(e, Exception):
                unread = True     # a dependency raised while the run re-read (see below)
            elif not isinstance(e, Exception):
                # Ctrl-C (or SystemExit) anywhere in the loop (normalize, apply, an event
                # callback): as for an interrupted generator call, the store keeps its last
                # record, and an attempt left without a candidate says why
                self.cut_short = True
                a = st.attempts[-1] if st.attempts else None
                if a is not None and not a.revision and not a.note:
                    a.note = f"interrupted: {type(e).__name__}"
            raise
        finally:
            self.undo = None
            if unrun:
                pass
            elif self.cut_short and not deferred:
                # stopped right at a generator call (rt.halt, or the call raised): the next
                # run goes on from there and generates (st.pending stays "generate"), even if
                # nothing changes meanwhile -- a node with nothing to validate with must not
                # fall back to the candidate of an older context. The store keeps its last
                # record, as if this run had not happened.
                self._keep(save=False)
            elif unread:
                # a dependency raised while the run re-read what the last one read (it
                # failed, or was halted): nothing was looked at, so nothing is kept -- the
                # snapshot, where the run goes on and the store's record stay as they were,
                # and the next run sees the change. (Kept, the snapshot would hold the
                # failure's tick: a dependency halted, then recomputed after rt.resume() at
                # that same tick, would look unchanged, and the old candidate be served.)
                pass
            elif not deferred:
                st.pending = False
                self._keep(save=True)
            elif taken_in:
                # set aside mid-loop: keep what this run read and learned, so that the next
                # pass goes on from here (st.pending says where), but save nothing until the
                # result is in
                self._keep(save=False)
            # else: set aside while re-reading (a dependency waits for its own run). Nothing
            # was looked at: the snapshot stays as it was, so the next pass sees the change.

    def _settle(self, pending: str) -> None:
        """The run has switched over: from here it goes on at ``pending`` (what a pass that
        sets it aside, or an interrupt, leaves for the next run), and nothing is undone."""
        self.st.pending = pending
        self.settled = True
        self.undo = None

    def _withdrawn_now(self) -> bool:
        """Was the current candidate NACKed from outside (rt.nack, a Reject)?"""
        return _fingerprint(self.st.candidate) in self.st.withdrawn

    def _reusable(self) -> tuple | None:
        """reuse="revalidate": (candidate, label) of the most recent other instance of this
        definition that was accepted on this runtime, if there is one and something can
        validate it here."""
        if self.node.reuse != "revalidate" or self._vacuous():
            return None
        prior = self.book.latest.get(self.node)
        if prior is None or prior[1] == self.st.label:
            return None
        return prior

    def _adopt(self, cand: Any, note: str) -> None:
        """Make ``cand`` the next revision without a model call (reused, or supplied by
        on_failure); it is validated like any other."""
        st = self.st
        fp = _repeat_fp(self.node, cand)
        basis = self._basis()
        st.revision += 1
        st.fingerprints.setdefault(_fingerprint(cand), st.revision)
        st.fingerprints.setdefault("n:" + fp, st.revision)
        st.values[st.revision] = cand
        st.candidate, st.has_candidate = cand, True
        st.base = 0
        st.attempts.append(_Attempt(st.revision, fp[:18], (), [], 0, 0.0, 0.0, note))
        st.generated_under = basis

    def _loop_on(self) -> Any:
        """Generate, validate, decide, until accepted or a stop condition holds."""
        st = self.st
        while True:
            self._settle("generate")   # where a pass that sets this run aside resumes
            stop = self._over_budget()
            if stop:
                self._fail(stop)
            cand = self._generate()
            fp = _fingerprint(cand)
            if fp in st.fingerprints:
                # the very candidate came back: its verdicts would be the same
                st.attempts[-1].note = f"same as revision {st.fingerprints[fp]}"
                self._fail("oscillation", repeated=st.fingerprints[fp])
            nfp = "n:" + _repeat_fp(self.node, cand)
            basis = self._basis()
            # the new revision is recorded as a whole, with where the run goes on: an
            # interrupt halfway undoes it (the next run generates again; a fingerprint
            # recorded without its revision would make that an "oscillation")
            undo = _switch_state(st)
            try:
                # the same after normalize: validated (it may pass where the other failed);
                # rejected, it is a repetition (see _judge)
                st.near = st.fingerprints.get(nfp, 0)
                st.revision += 1
                st.patch_nack = None
                st.fingerprints[fp] = st.revision
                st.fingerprints.setdefault(nfp, st.revision)
                st.values[st.revision] = cand
                st.candidate, st.has_candidate = cand, True
                st.base = 0
                st.attempts[-1].revision = st.revision
                st.attempts[-1].fingerprint = fp[:18]
                st.generated_under = basis
                st.pending = "judge"
            except BaseException:
                _put_back(st, undo)
                raise
            if self._judge():
                return self._stable()

    def _judge(self) -> bool:
        """Validate the new candidate and decide: True if accepted; raises NotAccepted on a
        stop condition; False to generate again."""
        st = self.st
        new = self._validate()
        stop = self._decide()
        if stop is None:
            return True
        if stop != "retry" and self._out_of_time():
            stop = "budget"       # a validator was cut at Budget(max_seconds): not its fault
        if stop != "retry":
            self._fail(stop)
        self._outcome(st.revision, "rejected")
        if st.near:
            near, st.near = st.near, 0
            self._note_attempt(f"same as revision {near} after normalize")
            self._fail("oscillation", repeated=near)
        self._keep_or_revert()
        if st.below >= self.node.patience:
            self._fail("divergence")
        st.stale_streak = 0 if new else st.stale_streak + 1
        if st.stale_streak >= 2:
            self._fail("no_progress")
        return False

    def _keep_or_revert(self) -> None:
        """After a rejected revision: a regression (a case an earlier revision of this
        context had ACKed is NACKed now) sets the revision aside unless it is strictly the
        best so far -- the next generation builds on the best one instead (st.base) -- and
        the divergence monitor counts revisions in a row below the best."""
        st, node = self.st, self.node
        cur = st.revision
        acked = _acked_by_revision(st)
        mine = acked.get(cur, set())
        nacked = {(vid, case) for (vid, case), vs in _verdicts_for(st, cur).items()
                  if any(v.kind == "NACK" for v in vs)}
        lost = set()
        best, score = 0, -1
        for rev in sorted(acked):
            if rev >= cur or rev not in st.values:
                continue
            lost |= acked[rev] & nacked
            if len(acked[rev]) > score:
                best, score = rev, len(acked[rev])
        if best and len(mine) < score:
            st.below += 1
            if st.below == node.patience - 1 and "patience" not in st.warned:
                st.warned.add("patience")
                _emit(self.book, events.Warning(st.label, "patience", st.below,
                                                node.patience))
        else:
            st.below = 0
        if not lost:
            return
        lost_t = tuple(sorted(lost))
        _emit(self.book, events.Regression(st.label, cur, lost_t, best))
        if len(mine) <= score:
            st.base = best
            self._outcome(cur, "reverted")
            self._note_attempt(f"regression: lost {_cases(lost_t)} that revision {best} had; "
                               f"the next generation starts from revision {best}")
            _emit(self.book, events.Reverted(st.label, cur, best))

    def _note_attempt(self, text: str) -> None:
        a = _attempt_of(self.st, self.st.revision)
        if a is not None:
            a.note = f"{a.note}; {text}" if a.note else text

    def _outcome(self, rev: int, outcome: str) -> None:
        a = _attempt_of(self.st, rev)
        if a is not None:
            a.outcome = outcome

    def _keep(self, save: bool) -> None:
        st = self.st
        reads = list(self.rt._reads())
        st.snapshot = [(d, d._changed_at) for d in reads]
        st.refs = None
        if save:
            _save(self.rt, self.inst, st, reads)

    def _basis(self) -> tuple:
        """What this run has read so far, with the tick at which each last changed."""
        return tuple((d, d._changed_at) for d in self.rt._reads())

    def _vacuous(self) -> bool:
        """True when re-validation could not look at anything (no validators, no rechecks)."""
        return not self.node.validators and (self.node.recheck is None
                                             or not self.st.regressions)

    def _reread(self) -> bool:
        """Read again what the last run read (recording it); True if anything changed."""
        changed = False
        st, rt = self.st, self.rt
        if st.snapshot is None and st.refs is not None:
            # restored from the store: compare content hashes instead of clock ticks
            for kind, ref, h in st.refs:
                d = rt._resolve_ref([kind, ref, h])
                if d is None:
                    changed = True
                    continue
                rt._read(d)
                if rt._vhash(d) != h:
                    changed = True
            return changed
        for d, at in st.snapshot or ():
            rt._read(d)
            if d._changed_at != at:
                changed = True
        return changed

    def _new_epoch(self) -> None:
        st = self.st
        keep = {}
        for key, (vs, d) in st.ledger.items():
            for v in vs:
                st.history.append((key, v, st.epoch))
            if key[3] == st.revision and key[0].startswith(("rt.nack", "reject")) and \
                    any(isinstance(v, NACK) for v in vs):
                # a NACK from outside is about the candidate, not the context: it stays
                keep[key] = ([v for v in vs if isinstance(v, NACK)],
                             {x for x in d if x[0] == "NACK"})
        st.ledger = keep
        st.made_under = {}
        st.epoch += 1
        st.evidence = set()
        st.fingerprints = {}      # oscillation is a candidate coming back within one context
        st.status = "active"
        # st.base stays: when the current candidate was reverted, the next generation (if
        # its re-validation fails) still builds on the best revision, never on it
        st.withdrawals = 0
        st.damped = False
        st.spot_due = False
        self._fresh_budget()

    def _fresh_budget(self) -> None:
        st = self.st
        st.spent_attempts = 0
        st.spent_tokens = 0
        st.spent_cost = 0.0
        st.started = time.monotonic()
        st.stale_streak = 0
        st.failed = None
        st.below = 0
        st.escalated = False
        st.warned = set()

    def _over_budget(self) -> str | None:
        """"budget" when the node's budget is used up, else None (and a Warning event for a
        monitor past 80% of its limit, the runtime-wide ones included, once per budget)."""
        st, b = self.st, self.node.budget
        used = (("attempts", st.spent_attempts, b.max_attempts),
                ("seconds", time.monotonic() - st.started, b.max_seconds),
                ("tokens", st.spent_tokens, b.max_tokens),
                ("cost", st.spent_cost, b.max_cost))
        for monitor, u, limit in used:
            if limit is None:
                continue
            if u >= limit:
                return "budget"
            self._warn_near(monitor, u, limit)
        g = self.book.budget
        if g is not None:
            # (the runtime-wide budget only warns here: it is claimed at each call,
            # atomically, by _graph_take -- a call made ahead was claimed in its worker)
            book = self.book
            for monitor, u, limit in (
                    ("graph calls", book.calls,
                     None if g.max_attempts is _DEFAULT_ATTEMPTS else g.max_attempts),
                    ("graph seconds", book.seconds, g.max_seconds),
                    ("graph tokens", book.tokens, g.max_tokens),
                    ("graph cost", book.cost, g.max_cost)):
                if limit is not None:
                    self._warn_near(monitor, u, limit)
        return None

    def _warn_near(self, monitor: str, used: float, limit: float) -> None:
        """A Warning event once per budget for a monitor past 80% of its limit."""
        st = self.st
        if used >= 0.8 * limit and monitor not in st.warned:
            st.warned.add(monitor)
            _emit(self.book, events.Warning(st.label, monitor, used, limit))

    def _previous(self) -> Any:
        """What the next generation builds on: the best revision after a revert, else the
        current candidate (None before the first)."""
        st = self.st
        if st.base and st.base in st.values:
            return st.values[st.base]
        return st.candidate if st.has_candidate else None

    def _generate(self) -> Any:
        st, node = self.st, self.node
        feedback = self._feedback()
        previous = self._previous()
        delay = node.backoff
        while True:
            self._halt_point()                          # rt.halt: no model call from here
            self.began, self.ran_for = False, None      # (set by the call: _call_gen)
            self.replayed, self.ticket = False, None
            call = self._call_gen(previous, feedback)   # may set the call aside (_Deferred)
            st.spent_attempts += 1
            self.book.generations += 1
            t0 = time.monotonic()
            try:
                out = call()
            except _GraphBudget as e:
                st.spent_attempts -= 1              # refused before the call: none was made
                self.book.generations -= 1
                st.pass_cut = "in this stabilization" in str(e)
                self._fail("budget", detail=f"the runtime's budget is used up ({e}); "
                                            + _graph_figures(self.book))
            except _OutOfTime:
                # Budget(max_seconds) ran out with the call in flight: an async call was
                # cancelled, a sync one abandoned (its late result is never used)
                self._ended("cut at the deadline (Budget(max_seconds))")
                st.attempts.append(_Attempt(0, "", feedback, [], 0, 0.0,
                                            time.monotonic() - t0,
                                            "cut at the deadline (Budget(max_seconds))"))
                self._fail("budget")
            except Exception as e:
                if not _transient(e):
                    # a generator error reaches the caller as a cell's does, and the next
                    # demand calls again: it is not an attempt of the loop's budget (else what
                    # a caller sees would depend on how often the node was asked before)
                    st.spent_attempts -= 1
                    self.cut_short = True
                    raise
                st.attempts.append(_Attempt(0, "", feedback, [], 0, 0.0,
                                            time.monotonic() - t0,
                                            f"transport error, retried: {type(e).__name__}"))
                stop = self._over_budget()
                if stop:
                    self._fail(stop)
                b = node.budget
                if b.max_seconds is not None:
                    left = b.max_seconds - (time.monotonic() - st.started)
                    if left <= delay:
                        self._fail("budget")
                time.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            except BaseException as e:  # KeyboardInterrupt, SystemExit: as an error
                self.cut_short = True
                if not self.began or isinstance(e, _Deferred):
                    # interrupted before the model was called (in a cooldown wait): no call;
                    # or the generator unwound at a read that needs work first (_Suspend,
                    # _Deferred): it is called again once that is done, as one attempt --
                    # as in a serial run, where the read waits in place
                    st.spent_attempts -= 1
                    self.book.generations -= 1
                raise
            tokens, cost = 0, 0.0
            record = None
            if isinstance(out, Candidate):
                record = out
                tokens, cost, out = out.tokens, out.cost, out.value
            seconds = time.monotonic() - t0 if self.ran_for is None else self.ran_for
            st.spent_tokens += tokens
            st.spent_cost += cost
            st.last_call = time.monotonic()
            # (the runtime-wide spend and GenerationFinished: where the call ended, finish())
            a = _Attempt(0, "", feedback, [], tokens, cost, seconds)
            if record is not None:
                a.rationale, a.hypothesis = str(record.rationale), str(record.hypothesis)
                a.patch, a.expect = record.patch, tuple(str(x) for x in record.expect)
            st.attempts.append(a)
            if node.patch and previous is not None and (record is None
                                                        or record.patch is not None):
                # patch mode: the answer is a patch against previous, applied here
                patch = out if record is None else record.patch
                a.patch = patch
                try:
                    out = self._apply(previous, patch)
                except BaseException as e:
                    if not isinstance(e, Exception):
                        # Ctrl-C (or SystemExit) in apply: as for an interrupted generator
                        # call, the store keeps its last record; the attempt says why it
                        # has no candidate
                        a.note = f"interrupted while applying the patch: {type(e).__name__}"
                        self.cut_short = True
                        raise
                    a.note = f"the patch did not apply: {type(e).__name__}: {e}"
                    # kept in the node's state, not here: a pass that runs the next call ahead
                    # resumes the loop, and must make the call with the same feedback
                    self.st.patch_nack = NACK(
                        "incr.patch", {"patch": _short(patch), "error": str(e)},
                        "the patch did not apply to previous: send a patch against "
                        "previous exactly, or the full answer")
                    feedback = self._feedback()
                    stop = self._over_budget()
                    if stop:
                        self._fail(stop)
                    continue
            return out

    def _ended(self, error: str) -> None:
        """A model call made here was cut at the deadline (Budget(max_seconds)): its seconds
        so far count (Runtime(budget=)) and GenerationFinished says so now; what it spends if
        it returns later is added by its finish(). (A call made ahead is announced by its
        worker when it ends.)"""
        ticket = self.ticket
        if not self.began or self.replayed or ticket is None:
            return
        with self.book.lock:
            announced, ticket.finished = ticket.finished, True
        if announced:
            return
        seconds = time.monotonic() - ticket.t0
        _graph_spent(self.book, 0, 0.0, seconds)
        _emit(self.book, events.GenerationFinished(self.st.label, self.st.spent_attempts, 0,
                                                   0.0, seconds, error=error))

    def _apply(self, previous: Any, patch: Any) -> Any:
        node = self.node
        if node.apply is not None:
            return node.apply(previous, patch)
        if not isinstance(previous, str) or not isinstance(patch, str):
            raise TypeError(f"patch=True applies a unified diff (a str) to a str; got "
                            f"{type(patch).__name__} against {type(previous).__name__} "
                            f"(pass apply=callable(previous, patch) for other kinds)")
        from incr.patches import apply_patch
        return apply_patch(previous, patch)

    def _halt_point(self) -> None:
        """Right before a generator call: if the runtime is halted (rt.halt), stop the loop
        with NotAccepted("halted") and record nothing more. The node keeps its state (no
        failure is remembered: after rt.resume() the same demand generates), and what a
        worker thread generated ahead for it is dropped, so a halted loop never takes a new
        candidate."""
        reason = self.rt.halt_reason
        if reason is None:
            return
        st = self.st
        st.prefetched.clear()
        self.cut_short = True
        self.book.halted.add(self.inst)     # made stale, with its readers, after rt.resume()
        _emit(self.book, events.Halted(st.label, "halted", reason))
        raise NotAccepted(st.label, "halted", _report(self.node, st, "halted", None, reason),
                          _best(st), st.spent_attempts)

    def _call_gen(self, previous: Any, feedback: tuple) -> Callable[[], Any]:
        """The generator call to make: a result that ran ahead in a worker thread (its reads
        replayed here, so they are recorded as this run's dependencies), or a direct call.
        Inside a stabilize that gathers calls, a call not yet made is set aside instead."""
        st, node, rt = self.st, self.node, self.rt
        key = (_fingerprint(previous) if st.has_candidate else None,
               tuple(_cex_key(v) for v in feedback))
        outcome = self._ahead(key)
        if outcome is not _NOTHING:
            st.prefetched.clear()
            self.began = True               # the call was made (ahead), and counted and
            self.replayed = True            # announced where it ended
            self.ran_for = self.ahead_seconds   # its own seconds, not the replay's

            def replay():
                if isinstance(outcome, BaseException):
                    raise outcome
                return outcome
            return replay
        wait = self._cooldown()
        book, attempt = self.book, st.spent_attempts + 1

        ticket = self.ticket = _Ticket()

        def start() -> float:
            # right before the model is called (in whichever thread or task calls it)
            if rt.halt_reason is not None:
                # halted meanwhile (during a cooldown wait): the call is not made
                if pf is not None and pf.is_worker():
                    raise _Deferred(st.label)   # the serial pass meets the halt
                self._halt_point()
            self.began = True
            _graph_take(book)
            _emit(book, events.GenerationStarted(st.label, attempt))
            ticket.t0 = time.monotonic()
            return ticket.t0

        def finish(out: Any = None, error: str = "") -> None:
            # where the call ended (its thread or task), once per call, whether or not the
            # loop takes its result (a halt may drop it): the runtime-wide spend, and
            # GenerationFinished -- unless the loop announced it cut at the deadline already,
            # when only what it spent is added
            tokens, cost = (out.tokens, out.cost) if isinstance(out, Candidate) else (0, 0.0)
            with book.lock:
                announced, ticket.finished = ticket.finished, True
            if announced:
                _graph_spent(book, tokens, cost, 0.0)
                return
            seconds = time.monotonic() - ticket.t0
            _graph_spent(book, tokens, cost, seconds)
            _emit(book, events.GenerationFinished(st.label, attempt, tokens, cost, seconds,
                                                  error))

        if node.gen_is_async and _aio.loop_running():
            # an async generator inside a running loop: the call is made as a task by the
            # nearest await of incr, and this run goes on from here when it is done
            async def agen():
                if wait:
                    await asyncio.sleep(wait)
                start()
                try:
                    out = await _aio.restarting(rt, lambda: node.gen(
                        *self.args, previous=previous, feedback=feedback, **self.kwargs))
                    _no_awaitable(node, st.label, out)
                except BaseException as e:
                    finish(error=_error_text(e))
                    raise
                finish(out)
                return out
            st.pending = "generate"
            raise _Suspend([_aio.Call(st, key, agen, self.inst, deadline=self._deadline())])

        def plain():
            if wait:
                time.sleep(wait)
            start()
            try:
                out = node.gen(*self.args, previous=previous, feedback=feedback, **self.kwargs)
                if node.gen_is_async and inspect.iscoroutine(out):
                    out = _aio.drive_call(   # this thread's own loop
                        rt, out, lambda: node.gen(*self.args, previous=previous,
                                                  feedback=feedback, **self.kwargs),
                        self._deadline())
                _no_awaitable(node, st.label, out)
            except BaseException as e:
                finish(error=_error_text(e))
                raise
            finish(out)
            return out

        def call():
            deadline = self._deadline()
            if deadline is None or node.gen_is_async or (pf is not None and pf.is_worker()):
                return plain()
            return self._bounded(plain, deadline)

        pf = rt.prefetch
        if pf is not None and pf.collecting and not node.gen_is_async:
            # (an async generator is a task on a loop, never a worker thread's call)
            def ahead():       # in a worker thread (incr.remote.Ahead)
                if rt.halt_reason is not None:
                    # halted since this call was set aside: it is not made; the next
                    # (serial) pass meets the halt before the call and stops the loop
                    raise _Deferred(st.label)
                return call()
            pf.add(st, key, ahead, self._deadline())
            st.pending = "generate"
            raise _Deferred(st.label)
        return call

    def _out_of_time(self) -> bool:
        deadline = self._deadline()
        return deadline is not None and time.monotonic() >= deadline

    def _cooldown(self) -> float:
        """Seconds to wait before this node's next model call (Budget(cooldown=)); fails
        the loop ("budget") when the wait would pass its Budget(max_seconds)."""
        st, b = self.st, self.node.budget
        if b.cooldown is None or not st.last_call:
            return 0.0
        wait = max(0.0, st.last_call + b.cooldown - time.monotonic())
        deadline = self._deadline()
        if wait and deadline is not None and time.monotonic() + wait >= deadline:
            self._fail("budget", detail=f"the cooldown of {b.cooldown:g} s between attempts "
                                        f"would pass Budget(max_seconds={b.max_seconds:g})")
        return wait

    def _deadline(self) -> float | None:
        """When Budget(max_seconds) runs out for this loop (time.monotonic()), or None."""
        b = self.node.budget
        return None if b.max_seconds is None else self.st.started + b.max_seconds

    def _bounded(self, fn: Callable[[], Any], deadline: float) -> Any:
        """Call a sync generator in a thread that may compute for this run, waiting until
        ``deadline`` at most: past it the call is abandoned (raises _OutOfTime; whatever it
        returns later is never used)."""
        box: dict = {}
        rt = self.rt

        def work():
            try:
                box["out"] = fn()
            except BaseException as e:
                box["exc"] = e

        t = threading.Thread(target=work, name=f"incr-generate-{self.st.label}", daemon=True)
        old = rt._lend(0)
        t.start()
        rt._lend(t.ident)
        t.join(max(0.0, deadline - time.monotonic()))
        rt._lend(old)
        if t.is_alive():
            raise _OutOfTime()
        if "exc" in box:
            raise box["exc"]
        return box["out"]

    def _feedback(self) -> tuple:
        """NACKs against the current candidate first, then earlier counterexamples."""
        st = self.st
        out, seen = [], set()
        for (vid, vver, case, rev), (vs, _d) in st.ledger.items():
            if rev == st.revision:
                for v in vs:
                    if isinstance(v, NACK):
                        k = _cex_key(v)
                        if k not in seen:
                            seen.add(k)
                            out.append(v)
        for v in st.regressions:
            k = _cex_key(v)
            if k not in seen:
                seen.add(k)
                out.append(v)
        if st.patch_nack is not None:
            out.append(st.patch_nack)
        return tuple(out)

    # -- evidence ---------------------------------------------------------------------------

    def _record(self, vid: str, vver: str, v: Any, regress: bool = True) -> bool:
        """Put one verdict for the current revision in the ledger; True if it is new evidence."""
        st = self.st
        key = (vid, vver, v.case, st.revision)
        st.made_under[key] = self._basis()   # (the latest confirmation of it counts)
        if not _ledger_add(st, key, v, regress):
            return False               # the same verdict again counts once
        _emit(self.book, events.Verdict(st.label, vid, st.revision, v))
        a = _attempt_of(st, st.revision)
        if a is not None:
            a.verdicts.append((vid, v))
        if isinstance(v, NACK):
            item = ("N", vid, v.case, _cex_key(v))
        elif isinstance(v, ACK):
            item = ("A", vid, v.case)
        else:
            return False               # UNKNOWN is not evidence
        if item in st.evidence:
            return False
        st.evidence.add(item)
        return True

    def _validate(self, resume: str = "judge") -> bool:
        """Run every validator and recheck on the current candidate; True if new evidence.

        Inside a stabilize that gathers calls, validators (but those with a timeout) of the
        candidate are set aside to run together with other nodes' calls, and the loop resumes
        at ``resume`` in the next pass."""
        node, st = self.node, self.st
        self._ahead_validators(resume)
        new = False
        for val in node.validators:
            self.book.validations += 1
            for v in self._verdicts_of(val):
                new |= self._record(val.id, val.version, v)
        if node.recheck is not None:
            rid = f"{node.name}.recheck"
            for r in list(st.regressions):
                self.book.validations += 1
                try:
                    v = node.recheck(st.candidate, r.counterexample, *self.args, **self.kwargs)
                except Reject as e:
                    if not self._own(e):
                        raise
                    v = NACK(e.case, e.counterexample, e.message)
                except Exception as e:
                    v = UNKNOWN(r.case, f"recheck raised {type(e).__name__}: {e}")
                if not isinstance(v, _VERDICTS):
                    what = _awaitable_problem(v)      # closed: never awaited, never a verdict
                    v = UNKNOWN(r.case, f"recheck returned {what or _short(v)}, not a verdict")
                v = _usable(v, "recheck")
                new |= self._record(rid, "1", v, regress=False)  # a case already kept
        self._regressions_checked()
        return new

    def _regressions_checked(self) -> None:
        """Every regression case is re-checked on the current revision by the validator
        that produced it (or recheck=): a case its validator gave no verdict on this time is
        UNKNOWN from that validator (so it blocks acceptance as any UNKNOWN of a required
        validator does), never silently assumed fixed. A Reject's case is checked again by
        the reader that rejected it, when it reads the new candidate. An rt.nack's case
        with no recheck= is UNKNOWN from "regression": shown in the checks and the report,
        not blocking (nothing here can re-check it; the caller of rt.nack can)."""
        st, node = self.st, self.node
        if not st.regressions:
            return
        mine = {v.id: v for v in node.validators}
        have = {(k[0], k[2]) for k in st.ledger if k[3] == st.revision}
        for src, r in zip(st.regression_src, st.regressions):
            val = mine.get(src)
            if val is not None:
                if (val.id, r.case) not in have:
                    self._record(val.id, val.version, UNKNOWN(
                        r.case, f"regression case not re-checked: {val.id} gave no verdict "
                                f"on it for this revision"), regress=False)
            elif src.startswith("rt.nack") and node.recheck is None and \
                    ("regression", r.case) not in have:
                self._record("regression", "", UNKNOWN(
                    r.case, f"regression case from {src} not re-checked: nothing here can "
                            f"(pass recheck= to re-check it on every revision)"),
                    regress=False)

    def _vkey(self, val: Validator) -> tuple:
        return ("validator", val.id, val.version, _fingerprint(self.st.candidate))

    def _ahead_validators(self, resume: str) -> None:
        st, rt = self.st, self.rt
        pf = rt.prefetch
        if pf is None or not pf.collecting:
            return
        if self._deadline() is not None:
            return       # Budget(max_seconds): validators run in the pass, cut at the deadline
        todo = [v for v in self.node.validators     # (async ones are tasks, never threads)
                if v.timeout is None and not v.is_async and self._vkey(v) not in st.prefetched]
        if not todo:
            return
        cand = st.candidate
        for val in todo:
            pf.add(st, self._vkey(val), functools.partial(self._collect, val, cand))
        st.pending = resume
        raise _Deferred(st.label)

    def _verdicts_of(self, val: Validator) -> list:
        """The validator's verdicts on the current candidate: from a run ahead (its reads
        replayed, so they are this run's dependencies), or by running it now."""
        outcome = self._ahead(self._vkey(val))
        if outcome is _NOTHING:
            return self._run_validator(val)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def _ahead(self, key: tuple) -> Any:
        """The outcome of a call that ran ahead under ``key``, its reads replayed here (so they
        are this run's dependencies); _NOTHING if none ran, or what it read moved on since."""
        ahead = self.st.prefetched.get(key)
        if ahead is None:
            return _NOTHING
        outcome, reads, seconds = ahead[:3]
        # (a call abandoned at the deadline carries no duration of its own: see _ended)
        self.ahead_seconds = (seconds if isinstance(seconds, (int, float))
                              and not isinstance(outcome, _OutOfTime) else None)
        fresh = True
        for d, at in reads:
            self.rt._read(d)      # (a read that waits sets this run aside: the result stays)
            if d._changed_at != at:
                fresh = False
        if len(ahead) > 3 and fresh:
            # it met a CycleError at a read of an instance on the stack (incr.remote
            # Ahead._call): kept only if that read would raise the same one here
            from incr import _core
            fresh = _core._stack_cycles_hold(self.rt, ahead[3])
        del self.st.prefetched[key]
        return outcome if fresh else _NOTHING

    def _own(self, e: Reject) -> bool:
        return e.node is self.node and tuple(e.node_args) == tuple(self.args)

    def _run_validator(self, val: Validator) -> list:
        cand = self.st.candidate
        if val.is_async and _aio.loop_running():
            # an async validator inside a running loop: called as a task by the nearest
            # await of incr; this run takes its verdicts when it goes on
            raise _Suspend([_aio.Call(self.st, self._vkey(val),
                                      functools.partial(self._acollect, val, cand), self.inst)])
        limit, why = self._validator_limit(val)
        if limit is None:
            return self._collect(val, cand)
        box: dict = {}
        rt = self.rt

        def work():
            try:
                box["out"] = self._collect(val, cand)
            except BaseException as e:  # a Reject of another node, carried to the loop
                box["exc"] = e

        t = threading.Thread(target=work, name=f"incr-validator-{val.__name__}", daemon=True)
        old = rt._lend(0)
        t.start()
        rt._lend(t.ident)
        t.join(limit)
        rt._lend(old)
        if t.is_alive():
            return [UNKNOWN("*", why)]
        if "exc" in box:
            raise box["exc"]
        return box["out"]

    def _validator_limit(self, val: Validator) -> tuple:
        """(seconds a validator may run, the UNKNOWN's reason past them): its timeout=, or
        what is left of Budget(max_seconds) when that is less; (None, "") for no limit."""
        limit, why = val.timeout, f"timed out after {val.timeout} s"
        deadline = self._deadline()
        if deadline is not None:
            left = max(0.0, deadline - time.monotonic())
            if limit is None or left < limit:
                limit, why = left, ("cut at the deadline (Budget(max_seconds="
                                    f"{self.node.budget.max_seconds:g}))")
        return limit, why

    async def _acollect(self, val: Validator, cand: Any) -> list:
        limit, why = self._validator_limit(val)
        t0 = time.monotonic()
        try:
            res = await asyncio.wait_for(_aio.restarting(
                self.rt, lambda: val.fn(cand, *self.args, **self.kwargs)), limit)
        except asyncio.TimeoutError:
            out = [UNKNOWN("*", why)]
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            out = self._verdicts(val, None, e)
        else:
            out = self._verdicts(val, res, None)
        return self._validated(val, t0, out)

    def _collect(self, val: Validator, cand: Any) -> list:
        t0 = time.monotonic()
        try:
            res = val.fn(cand, *self.args, **self.kwargs)
            if val.is_async and inspect.iscoroutine(res):
                res = _aio.drive_call(   # sync code: this thread's loop
                    self.rt, res, lambda: val.fn(cand, *self.args, **self.kwargs))
        except BaseException as e:
            out = self._verdicts(val, None, e)
        else:
            out = self._verdicts(val, res, None)
        return self._validated(val, t0, out)

    def _validated(self, val: Validator, t0: float, out: list) -> list:
        """A validator's run is over: announce it (events.ValidationFinished); its verdicts."""
        if self.book.listeners:
            _emit(self.book, events.ValidationFinished(
                self.st.label, val.id, self.st.revision, time.monotonic() - t0,
                tuple(v.kind for v in out)))
        return out

    def _verdicts(self, val: Validator, res: Any, exc: BaseException | None) -> list:
        out = []
        try:
            if exc is not None:
                raise exc
            if isinstance(res, _VERDICTS):
                out.append(_usable(res, val.id))
            elif res is None:
                pass
            elif (what := _awaitable_problem(res)) is not None or inspect.isasyncgen(res):
                what = what or "an async generator"
                out.append(UNKNOWN("*", f"{val.id} returned {what}, not verdicts: a sync "
                                        f"validator must return verdicts (make it an async "
                                        f"def to await inside it; this one was closed, "
                                        f"never awaited)"))
            else:
                for v in res:
                    if not isinstance(v, _VERDICTS):
                        what = _awaitable_problem(v)
                        if what is not None:
                            out.append(UNKNOWN("*", f"{val.id} yielded {what}, not a verdict "
                                                    f"(it was closed, never awaited)"))
                        else:
                            out.append(UNKNOWN("*", f"{val.id} produced {_short(v)}, not a "
                                                    f"verdict"))
                        break
                    out.append(_usable(v, val.id))
        except Reject as e:
            if not self._own(e):
                raise
            out.append(_usable(NACK(e.case, e.counterexample, e.message), val.id))
        except Exception as e:
            out.append(UNKNOWN("*", f"{val.id} raised {type(e).__name__}: {e}"))
        if not out:
            out.append(UNKNOWN("*", f"{val.id} gave no verdict"))
        return out

    def _decide(self) -> str | None:
        """None: accepted. "retry": generate again. Otherwise the reason to stop."""
        st, node = self.st, self.node
        return _decision(node, st)

    # -- exits ------------------------------------------------------------------------------

    def _stable(self) -> Any:
        st, node, book = self.st, self.node, self.book
        was = st.status
        st.status = "stable"
        st.failed = None
        st.base = 0
        if was != "stable":
            self._outcome(st.revision, "accepted")
            _emit(book, events.Accepted(st.label, st.revision))
            if node.recheck_every is not None:
                book.spot[self.inst] = (self.rt.revision, time.monotonic())
        if node.reuse == "revalidate" and not self._vacuous():
            book.latest[node] = (st.candidate, st.label)
        return st.candidate

    def _fail(self, reason: str, repeated: int | None = None, detail: str | None = None) -> None:
        st, node = self.st, self.node
        if st.attempts and st.attempts[-1].revision and not st.attempts[-1].outcome:
            st.attempts[-1].outcome = f"stopped: {reason}"
        best = _best(st)
        report = _report(node, st, reason, repeated, detail=detail, book=self.book)
        st.status = "failed"
        exc = NotAccepted(st.label, reason, report, best, st.spent_attempts)
        st.failed = exc
        st.failed_events = st.events
        escalate = node.on_failure or self.book.on_failure
        if escalate is not None and not st.escalated and not st.damped:
            st.escalated = True
            # what the caller supplies (a human, a stronger model)
            cand = escalate(FailureReport(exc))
            if cand is not None:
                self._escalated(cand, exc)   # accepted: returns through _Escalated; rejected:
                                             # stops (and says so) in its own _fail
        _emit(self.book, events.Stopped(st.label, reason))   # (after escalation: a stop
        raise exc                                            # that does not stick is none)

    def _escalated(self, cand: Any, exc: NotAccepted) -> None:
        """on_failure returned a candidate: it is validated like any other; accepted, the
        run returns it (raises _Escalated); otherwise the loop stops as before."""
        st = self.st
        if isinstance(cand, Candidate):
            rec, cand = cand, cand.value
        else:
            rec = None
        what = _awaitable_problem(cand)      # (a coroutine is closed: never awaited)
        if what is not None:
            raise TypeError(f"incr.llm {st.label}: on_failure returned {what}; it must return "
                            f"a candidate or None (a plain def; await inside it with "
                            f"asyncio.run if it must)")
        st.failed = None
        st.status = "active"
        self._adopt(cand, "supplied by on_failure after: " + exc.reason)
        if rec is not None:
            a = st.attempts[-1]
            a.rationale, a.hypothesis, a.patch = str(rec.rationale), str(rec.hypothesis), rec.patch
        self._settle("judge")
        if self._judge():
            raise _Escalated(self._stable())
        # rejected: stop with the reason the loop had (on_failure is asked once per budget)
        self._fail(exc.reason)


# what an interrupted switch of a node's state undoes (_Loop.run: a new context, a fresh
# budget, a reused or escalated candidate, a stop; _Loop._loop_on: a new revision)
_SWITCHED = ("pending", "spot_due", "pass_cut", "ledger", "made_under", "epoch", "evidence",
             "fingerprints", "status", "withdrawals", "damped", "spent_attempts",
             "spent_tokens", "spent_cost", "started", "stale_streak", "failed", "failed_events",
             "below", "escalated", "warned", "revision", "candidate", "has_candidate", "base",
             "generated_under", "near", "patch_nack", "regressions", "regression_src")
_switched = operator.attrgetter(*_SWITCHED)
_SWITCHED_COPIED = tuple(i for i, name in enumerate(_SWITCHED)    # (changed in place)
                         if name in ("ledger", "made_under", "evidence", "fingerprints",
                                     "warned", "regressions", "regression_src"))


def _switch_state(st: _Node) -> tuple:
    """The fields of ``st`` a switch changes (see _put_back), their containers copied -- but
    for what only grows (history, attempts, values: one per revision), kept by length, so
    that saving costs the same however long the node has lived."""
    saved = list(_switched(st))
    for i in _SWITCHED_COPIED:
        saved[i] = saved[i].copy()
    last = st.attempts[-1] if st.attempts else None
    own = None if last is None else (last.revision, last.fingerprint, last.outcome, last.note)
    return (saved, (st.history, len(st.history)), (st.attempts, len(st.attempts)), st.values,
            last, own)


def _put_back(st: _Node, undo: tuple) -> None:
    saved, (history, nh), (attempts, na), values, last, own = undo
    for name, v in zip(_SWITCHED, saved):
        setattr(st, name, v)
    del history[nh:]
    del attempts[na:]
    for rev in [rev for rev in values if rev > st.revision]:   # (made in the switch)
        del values[rev]
    st.history, st.attempts, st.values = history, attempts, values
    if last is not None:
        last.revision, last.fingerprint, last.outcome, last.note = own


def _attempt_of(st: _Node, rev: int) -> _Attempt | None:
    """The (latest) attempt that made revision ``rev``, or None."""
    for a in reversed(st.attempts):
        if a.revision == rev:
            return a
    return None


class _Ticket:
    """One model call: when it started, and whether GenerationFinished was sent for it."""
    __slots__ = ("t0", "finished")

    def __init__(self):
        self.t0 = time.monotonic()
        self.finished = False


def _error_text(e: BaseException) -> str:
    try:
        text = str(e)
    except Exception:
        text = ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


class _Escalated(Exception):
    """Internal: on_failure supplied a candidate that was accepted; run() returns it."""

    def __init__(self, value: Any):
        super().__init__("incr: accepted after on_failure")
        self.value = value


def _acked_by_revision(st: _Node) -> dict:
    """revision -> {(validator id, case) with ACKs and no other verdict}, this context."""
    kinds: dict = {}
    for (vid, _vv, case, rev), (vs, _d) in st.ledger.items():
        kinds.setdefault(rev, {}).setdefault((vid, case), set()).update(v.kind for v in vs)
    return {rev: {k for k, ks in per.items() if ks == {"ACK"}} for rev, per in kinds.items()}


def _cases(pairs) -> str:
    return ", ".join(f"{vid} / {case!r}" for vid, case in pairs)


def _verdicts_for(st: _Node, rev: int) -> dict:
    """(vid, case) -> list of verdicts for revision ``rev`` in the current epoch."""
    out: dict = {}
    for (vid, _vv, case, r), (vs, _d) in st.ledger.items():
        if r == rev:
            out.setdefault((vid, case), []).extend(vs)
    return out


def _decision(node: LLMNode, st: _Node) -> str | None:
    vs = _verdicts_for(st, st.revision)
    kinds: dict = {}
    for (vid, case), lst in vs.items():
        ks = {v.kind for v in lst}
        if "ACK" in ks and "NACK" in ks:
            return "validator_unstable"
        kinds[(vid, case)] = ks
    # a NACK from anyone (a validator, a recheck, rt.nack, a Reject) blocks acceptance;
    # UNKNOWN blocks it when it comes from a required validator
    nack = any("NACK" in ks for ks in kinds.values())
    required = node.accept.required if node.accept.required is not None else node.validators
    ok = not nack
    for val in required:
        mine = [ks for (vid, _c), ks in kinds.items() if vid == val.id]
        if not any("ACK" in ks for ks in mine) or any(ks - {"ACK"} for ks in mine):
            ok = False
    acked = sum(1 for ks in kinds.values() if ks == {"ACK"})
    if ok and acked >= node.accept.min_cases:
        return None
    if nack:
        return "retry"
    return "unknown"


def _best(st: _Node) -> Any:
    """The candidate (of this epoch) with the most distinct ACKed cases, or None."""
    acks: dict = {}
    for (vid, _vv, case, rev), (vs, _d) in st.ledger.items():
        if any(v.kind == "ACK" for v in vs):
            acks.setdefault(rev, set()).add((vid, case))
    best, score = None, 0
    for rev in sorted(acks):
        if len(acks[rev]) > score and rev in st.values:
            best, score = rev, len(acks[rev])
    return None if best is None else st.values[best]


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


# --- the runtime's side: state, outside verdicts, Reject -----------------------------------


def _instance(rt, node, args, kwargs, what):
    if not isinstance(node, LLMNode):
        raise TypeError(f"rt.{what}: expected an @incr.llm node, got {node!r}")
    inst = rt._instance(node, args, kwargs, create=rt.store_path is not None)
    st = None if inst is None else _node_of(rt, inst, create=False)
    return inst, st


def _context_key(rt, node: LLMNode, inst) -> tuple[str, dict]:
    deps = rt._dep_info(inst)
    try:
        args = _keys.encode(tuple(inst.args))
    except TypeError:
        args = repr(inst.args).encode()
    key = _keys.digest("llm", _keys.encode([node._incr_ident, args, node.validator_key,
                                            [[lab, h or b""] for lab, _r, h in deps]]),
                       rt.hash)
    return key.hex(), {lab: rev for lab, rev, _h in deps}


def state(rt, node, args, kwargs) -> NodeState:
    if isinstance(node, Cell) and not isinstance(node, LLMNode):
        # a plain cell: "stable" when up to date, "invalid" until it runs again (after a
        # change, or a NACK that withdrew an LLM node it read)
        inst = rt._instance(node, args, kwargs, create=False)
        if inst is None:
            raise IncrError(f"rt.state: {node.qualname_label}{tuple(args)!r} has never run on "
                            f"this runtime; call it first")
        stale = rt._stale(inst)
        return NodeState(candidate=None if stale else inst.value, revision=0,
                         status="invalid" if stale else "stable")
    inst, st = _instance(rt, node, args, kwargs, "state")
    if st is None and inst is not None and inst.action in ("loaded", "reused"):
        # taken from the store with no saved state (or a damaged one): what the entry says
        st = _book(rt).nodes[inst] = _Node(label=inst.label_text, candidate=inst.value,
                                           has_candidate=True, revision=1, status="stable")
        st.values[1] = inst.value
    if st is None:
        label = (inst.label_text if inst is not None else
                 f"{node.qualname_label}{tuple(args)!r}")
        raise IncrError(f"rt.state: {label} has never run on this runtime; call it first")
    key, revs = _context_key(rt, node, inst)
    checks = {}
    for (vid, vver, case, rev), (vs, _d) in st.ledger.items():
        # a NACK outranks an UNKNOWN, which outranks an ACK, when one key holds several
        checks[(vid, vver, case, rev)] = max(vs, key=lambda v: {"NACK": 2, "UNKNOWN": 1}.get(v.kind, 0))
    status = st.status
    if status == "stable" and rt._stale(inst, True):
        status = "invalid"       # something it read was withdrawn or changed: until it re-runs
    elif status == "stable" and not _acked_now(st):
        # accepted with no ACK at all (no validators, or a policy that requires none and
        # validators that said UNKNOWN or nothing): accepted, not validated
        status = "unvalidated"
    return NodeState(candidate=st.candidate, revision=st.revision, context_key=key,
                     dependency_revisions=revs, checks=checks, status=status,
                     attempts=[_attempt_info(st, a) for a in st.attempts])


def _acked_now(st: _Node) -> bool:
    """Has the current revision at least one ACK? (Accepted with none: "unvalidated".)"""
    return any(k[3] == st.revision and any(v.kind == "ACK" for v in vs)
               for k, (vs, _d) in st.ledger.items())


def _attempt_info(st: _Node, a: _Attempt) -> dict:
    """One attempt as rt.state(...).attempts shows it."""
    return {"revision": a.revision,
            "candidate": st.values.get(a.revision) if a.revision else None,
            "rationale": a.rationale, "hypothesis": a.hypothesis, "patch": a.patch,
            "expect": a.expect, "feedback": a.feedback, "verdicts": list(a.verdicts),
            "outcome": a.outcome, "note": a.note, "tokens": a.tokens, "cost": a.cost,
            "seconds": a.seconds}


def halt(rt, reason) -> None:
    """rt.halt(reason): from now on every LLM loop on ``rt`` stops before its next generator
    call with NotAccepted("halted"). Only sets a flag, so it may be called from any thread and
    from a signal handler: it takes no lock and does not claim the runtime. A second halt
    replaces the reason."""
    if not isinstance(reason, str):
        raise TypeError(f"rt.halt: reason must be a str saying why, got {_short(reason)}")
    if not reason:
        raise ValueError("rt.halt: reason must be a non-empty str saying why")
    problem = _field_problem("reason", reason)
    if problem is not None:
        raise TypeError(f"rt.halt: {problem}")
    rt.halt_reason = reason


def resume(rt) -> None:
    """rt.resume(): model calls are allowed again (a no-op when not halted)."""
    rt.halt_reason = None


def outside_verdict(rt, node, args, kwargs, verdict, revision, source) -> None:
    """rt.ack / rt.nack: a verdict from outside, bound to ``revision``. Every argument is
    checked before anything changes (TypeError naming it; ValueError for a revision the node
    never had; IncrError for a node without a candidate; ReentrancyError inside a
    computation): a refused verdict leaves the node, its ledger and the store as they were."""
    if not isinstance(revision, int) or isinstance(revision, bool):
        raise TypeError(f"rt.{source}: revision must be an int, the candidate revision the "
                        f"verdict is about (see rt.state(...).revision), got {_short(revision)}")
    problem = _verdict_problem(verdict)
    if problem is not None:
        raise TypeError(f"rt.{source}: {problem}; nothing was recorded")
    inst, st = _instance(rt, node, args, kwargs, source)
    if st is None or not st.revision:
        label = inst.label_text if inst is not None else node.qualname_label
        raise IncrError(f"rt.{source}: {label} has no candidate on this runtime yet")
    if not 1 <= revision <= st.revision:
        raise ValueError(f"rt.{source}: revision must be one of the candidate revisions of "
                         f"{st.label} (1..{st.revision}), got {revision!r}")
    rt._invalidate(inst, check=True)   # a change: refused inside a computation, before it
    snap = _snapshot(st)
    try:
        must = _note(st, f"rt.{source}", "", verdict, revision, rt.llm)
        _save(rt, inst, st, None)
        if must:
            rt._invalidate(inst)
    except BaseException:
        # interrupted (Ctrl-C lands at any bytecode): the verdict is not half-recorded. The
        # node's ledger and status are as before; a withdrawal already done stays (the node
        # runs again and finds its candidate still stands); the call can simply be repeated.
        _restore(st, snap)
        try:
            _save(rt, inst, st, None)
        except Exception:
            pass
        raise
    rt._commit()          # a verdict from outside is durable when rt.nack/rt.ack returns


def _snapshot(st: _Node) -> tuple:
    """What an outside verdict changes in a node's state, copied (see _restore)."""
    return ({k: (list(vs), set(d)) for k, (vs, d) in st.ledger.items()}, st.status, st.events,
            set(st.withdrawn), list(st.regressions), list(st.regression_src), st.withdrawals)


def _restore(st: _Node, snap: tuple) -> None:
    (st.ledger, st.status, st.events, st.withdrawn, st.regressions, st.regression_src,
     st.withdrawals) = snap


def _ledger_add(st: _Node, key: tuple, v: Any, regress: bool = True) -> bool:
    """Add verdict ``v`` under ``key`` (validator id, version, case, revision); False if the
    same verdict is there already. A NACK's counterexample becomes a regression case."""
    entry = st.ledger.get(key)
    vs, distinct = ([], set()) if entry is None else entry
    ident = (v.kind, _cex_key(v) if isinstance(v, NACK) else "")
    if ident in distinct:
        return False
    distinct.add(ident)
    vs.append(v)
    if entry is None:
        st.ledger[key] = (vs, distinct)   # never an empty entry, even if interrupted above
    if regress and isinstance(v, NACK) and v.counterexample is not None and \
            all(_cex_key(r) != _cex_key(v) for r in st.regressions):
        st.regressions.append(v)      # a regression case for every later revision
        st.regression_src.append(key[0])   # ... re-checked by the validator that found it
    return True


def _note(st: _Node, vid: str, vver: str, v, revision: int, book=None) -> bool:
    """Record an outside verdict; True when the node must run again (its current candidate
    was NACKed, or an ACK may complete its acceptance)."""
    if not _ledger_add(st, (vid, vver, v.case, revision), v):
        return False
    if revision != st.revision:
        return False                  # history: never moves the current status
    st.events += 1
    if isinstance(v, NACK):
        if st.status == "stable":
            st.withdrawals += 1
            if book is not None:
                _emit(book, events.Withdrawn(st.label, revision,
                                             f"{vid}: NACK on {v.case!r}"))
        if st.status != "failed":
            st.status = "invalid"
        if st.has_candidate:
            st.withdrawn.add(_fingerprint(st.candidate))
        if book is not None:
            # reuse="revalidate" offers only an accepted candidate: not one withdrawn since
            for n, (_cand, label) in list(book.latest.items()):
                if label == st.label:
                    book.latest.pop(n, None)
        return True
    return st.status != "stable"


def _evidence(rt, inst) -> tuple[list, list]:
    """For Runtime._check (invariant I7), on an instance that is clean (not stale, has a
    value): (problems of its own state, basis). A clean instance holds its stable candidate;
    the basis is what that candidate's acceptance rests on, as (what, node, changed_at): the
    reads made before each verdict on the current revision that this process recorded, and,
    for a node with nothing to validate with, the reads of the candidate's generation. The
    core checks that none of those nodes changed or was withdrawn since."""
    st = None if rt.llm is None else rt.llm.nodes.get(inst)
    if st is None:
        return [], []           # taken from the store and never asked about: nothing kept
    problems, basis = [], []
    if st.status != "stable":
        problems.append(f"is clean but its status is {st.status!r}")
    elif not st.has_candidate or not _same(inst.value, st.candidate):
        problems.append(f"holds {inst.value!r}, not its stable candidate {st.candidate!r}")
    for key, under in st.made_under.items():
        if key[3] == st.revision and key in st.ledger:
            what = f"the verdict {key[0]} / {key[2]!r} on revision {key[3]}"
            basis.extend((what, d, at) for d, at in under)
    node = inst.cell
    if not node.validators and (node.recheck is None or not st.regressions):
        basis.extend((f"revision {st.revision}", d, at) for d, at in st.generated_under)
    return problems, basis


def _same(a: Any, b: Any) -> bool:
    try:
        return a is b or bool(a == b)
    except Exception:
        return False


def _consumed(node, args) -> int | None:
    """The revision of node(*args) that the running computation consumed (for Reject)."""
    try:
        rt = current()
        inst = rt._instance(node, args, {}, create=False)
        st = None if inst is None or rt.llm is None else rt.llm.nodes.get(inst)
        return None if st is None else st.revision
    except Exception:
        return None


def _absorb_reject(rt, e: Reject):
    """A Reject reached the top of a demand or stabilization: the instance to withdraw, or
    None when the Reject cannot apply (then it propagates to the caller)."""
    node = e.node
    if not isinstance(node, LLMNode):
        e.add_note(f"incr: Reject needs an @incr.llm node, got {node!r}")
        return None
    try:
        inst = rt._instance(node, e.node_args, {}, create=False)
    except TypeError:
        return None
    st = None if inst is None else _node_of(rt, inst, create=False)
    if st is None or not st.revision:
        e.add_note(f"incr: {node.qualname_label}{e.node_args!r} has no candidate to reject")
        return None
    problem = _verdict_problem(NACK(e.case, e.counterexample, e.message))
    if problem is not None:
        e.add_note(f"incr: this Reject cannot be recorded: {problem}")
        return None
    rev = e.revision if e.revision is not None else st.revision
    st.rejections += 1
    by = f"reject:{e.by}" if e.by else "reject"
    if not _note(st, by, "", NACK(e.case, e.counterexample, e.message), rev, rt.llm):
        # nothing new: the same NACK again, or one for a revision already replaced. Running
        # the rejecting computation again would only reject again: the Reject propagates.
        e.add_note(f"incr: {st.label} was already rejected on {e.case!r} for revision {rev}; "
                   f"the rejecting computation does not read a newer candidate of it")
        return None
    _save(rt, inst, st, None)
    return inst


# --- effects ---------------------------------------------------------------------------------


def effect(fn=None, /, *, version=None, allow_unvalidated=False):
    """A cell with effects in the world (sending, writing). It runs only once every LLM node
    it depends on is stable: a read (of an LLM node, or of a cell resting on one, at any
    depth) hands the effect its value only if each of those nodes is accepted with evidence;
    a node that failed raises its NotAccepted, and one accepted with no ACK ("unvalidated": no
    validators) raises IncrError -- unless ``allow_unvalidated=True``. The effect's run then
    fails (nothing it did after that read happens) and runs again at its next demand. A later
    withdrawal of what it read does not undo it; it runs again only when what it read
    changes."""
    if not isinstance(allow_unvalidated, bool):
        raise TypeError(f"incr.effect: allow_unvalidated must be a bool, got "
                        f"{_short(allow_unvalidated)}")

    def make(f):
        c = Cell(f, version=version, cutoff=EQUAL, local=True)   # never on a remote worker
        c._incr_effect = True
        c._incr_allow_unvalidated = allow_unvalidated
        c.is_effect = True
        _core._note_effect()
        return c
    return make if fn is None else make(fn)


def effect_read(rt, effect_inst, n) -> None:
    """Called by the core when the running effect ``effect_inst`` reads ``n`` (its value is
    up to date): IncrError if an LLM node that ``n`` is or rests on is not stable (see
    ``effect``). O(instances ``n`` rests on), paid by effects only."""
    book = rt.llm
    if book is None:
        return                                   # no LLM node has run on this runtime
    allow = getattr(effect_inst.cell, "_incr_allow_unvalidated", False)
    seen, todo = set(), [n]
    while todo:
        m = todo.pop()
        if m in seen or not isinstance(m, Instance):
            continue                             # inputs rest on nothing
        seen.add(m)
        if m.cell.is_llm and not allow:
            st = book.nodes.get(m)
            if st is not None and st.status == "stable" and not _acked_now(st):
                via = "" if m is n else f" (through {n.label_text})"
                raise IncrError(
                    f"incr.effect {effect_inst.label_text} reads {m.label_text}{via}, which is "
                    f"accepted without any ACK (status 'unvalidated': no validator checked "
                    f"it); an effect runs only on stable LLM nodes, so it did not run. Give "
                    f"{m.cell.qualname_label} a validator, ACK the candidate with rt.ack(...), "
                    f"or declare @incr.effect(allow_unvalidated=True)")
        todo.extend(m._deps)


# --- persistence: the node's state in the store (kind-2 records in the ``nodes`` DB) ---------
#
# The accepted candidate itself is an ordinary entry (the node is a cell): a new process takes
# it from the store without running the loop when everything the loop read hashes the same
# (the PASS path). This record carries the rest: candidates, the ledger, the attempt log, the
# failure report and what the last run read, so that a new process resumes where the last
# one stopped. Payload values go through incr.keys (canonical msgpack, no pickle); a value
# the codec cannot encode is kept as its repr, marked as such.


def _node_of(rt, inst, create: bool) -> _Node | None:
    book = _book(rt)
    st = book.nodes.get(inst)
    if st is None:
        st = _load(rt, inst)
        if st is None and create:
            st = _Node(label=inst.label_text)
        if st is not None:
            book.nodes[inst] = st
    return st


def _enc(x: Any) -> list:
    try:
        return [0, _keys.encode(x)]
    except Exception:       # TypeError; or a registered type's encoder that fails
        return [1, repr(x)]


def _dec(x: list) -> Any:
    if type(x) is not list or len(x) != 2:
        raise ValueError("malformed value")
    if x[0] == 0 and type(x[1]) is bytes:
        return _keys.decode(x[1])
    if x[0] == 1 and type(x[1]) is str:
        return x[1]
    raise ValueError("malformed value")


def _venc(v: Any) -> list:
    if isinstance(v, ACK):
        return ["ACK", v.case, _enc(v.evidence), ""]
    if isinstance(v, NACK):
        return ["NACK", v.case, _enc(v.counterexample), v.message]
    return ["UNKNOWN", v.case, _enc(None), v.reason]


def _vdec(x: list) -> Any:
    kind, case, payload, text = x
    if type(case) is not str or type(text) is not str:
        raise ValueError("malformed verdict")
    if kind == "ACK":
        return ACK(case, _dec(payload))
    if kind == "NACK":
        return NACK(case, _dec(payload), text)
    if kind == "UNKNOWN":
        return UNKNOWN(case, text)
    raise ValueError("malformed verdict")


def _save(rt, inst, st: _Node, reads) -> None:
    ikey = rt._ikey(inst)
    if ikey is None or not st.has_candidate and st.failed is None:
        return
    refs = rt._refs(reads) if reads is not None else st.refs
    if reads is None and st.snapshot is not None:
        refs = rt._refs([d for d, _at in st.snapshot])
    f = st.failed
    best = None
    if f is not None:
        for rev, val in st.values.items():
            if val is f.best and f.best is not None:
                best = rev
    payload = {
        "label": st.label, "revision": st.revision, "status": st.status,
        "candidate": _enc(st.candidate), "has": st.has_candidate,
        "values": [[r, _enc(v)] for r, v in st.values.items()],
        "ledger": [[vid, vver, case, rev, [_venc(v) for v in vs]]
                   for (vid, vver, case, rev), (vs, _d) in st.ledger.items()],
        "history": [[list(k), _venc(v), ep] for k, v, ep in st.history[-200:]],
        "regressions": [_venc(v) for v in st.regressions],
        "attempts": [[a.revision, a.fingerprint, [_venc(v) for v in a.feedback],
                      [[vid, _venc(v)] for vid, v in a.verdicts], a.tokens, float(a.cost),
                      float(a.seconds), a.note, a.rationale, a.hypothesis, _enc(a.patch),
                      list(a.expect), a.outcome] for a in st.attempts[-100:]],
        "regression_src": list(st.regression_src),
        "unvalidated": not _acked_now(st),
        "control": [st.base, st.below, st.withdrawals, st.damped, st.escalated],
        "fingerprints": [[k, r] for k, r in st.fingerprints.items()],
        "withdrawn": sorted(st.withdrawn),
        "epoch": st.epoch, "spent": [st.spent_attempts, st.spent_tokens, float(st.spent_cost)],
        "evidence": [list(e) for e in st.evidence], "streak": st.stale_streak,
        "events": st.events, "failed_events": st.failed_events, "rejections": st.rejections,
        "failed": None if f is None else [f.reason, f.report, best, f.attempts],
        "refs": refs,
    }
    rt._store_put_node(ikey, _pack_record(payload))


def _pack_record(payload: dict) -> bytes:
    """A kind-2 record of the ``nodes`` database: header, checksum, msgpack map."""
    from incr.store import FORMAT, HEADER, KIND_NODE, MAGIC
    import msgpack
    body = msgpack.packb(payload, use_bin_type=True)
    return HEADER.pack(MAGIC, FORMAT, KIND_NODE, len(body), _keys.checksum(body)) + body


def _unpack_record(data: bytes) -> dict:
    """The map of a kind-2 record, everything checked first (ValueError otherwise)."""
    from incr.store import FORMAT, HEADER, KIND_NODE, MAGIC, MAX_RECORD
    import msgpack
    if len(data) < HEADER.size:
        raise ValueError("shorter than a header")
    magic, fmt, kind, length, crc = HEADER.unpack_from(data)
    if magic != MAGIC or fmt != FORMAT or kind != KIND_NODE:
        raise ValueError("not an incr node record of this format")
    if length > MAX_RECORD or length != len(data) - HEADER.size:
        raise ValueError("length field does not match")
    body = data[HEADER.size:]
    if _keys.checksum(body) != crc:
        raise ValueError("checksum mismatch")
    p = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True,
                        ext_hook=_no_ext)
    if type(p) is not dict:
        raise ValueError("payload is not a map")
    return p


def _load(rt, inst) -> _Node | None:
    ikey = rt._ikey(inst)
    if ikey is None:
        return None
    data = rt._store_node(ikey)
    if data is None:
        return None
    try:
        return _unpack_node(data, inst.label_text)
    except Exception as e:   # damaged or foreign: a miss, never a state
        import warnings
        from incr.store import DamagedRecordWarning
        warnings.warn(f"incr store: the saved state of {inst.label_text} is damaged ({e}); "
                      f"it starts afresh", DamagedRecordWarning, stacklevel=3)
        return None


def _unpack_node(data: bytes, label: str) -> _Node:
    p = _unpack_record(data)
    st = _Node(label=label)
    st.revision = int(p["revision"])
    st.status = p["status"]
    if st.status not in ("active", "stable", "invalid", "failed"):
        raise ValueError("unknown status")
    st.has_candidate = bool(p["has"])
    st.candidate = _dec(p["candidate"])
    st.values = {int(r): _dec(v) for r, v in p["values"]}
    for vid, vver, case, rev, vs in p["ledger"]:
        dec = [_vdec(v) for v in vs]
        st.ledger[(vid, vver, case, int(rev))] = (
            dec, {(v.kind, _cex_key(v) if isinstance(v, NACK) else "") for v in dec})
    st.history = [(tuple(k), _vdec(v), int(ep)) for k, v, ep in p["history"]]
    st.regressions = [_vdec(v) for v in p["regressions"]]
    for row in p["attempts"]:
        rev, fp, fb, vds, tok, cost, sec, note = row[:8]
        a = _Attempt(int(rev), str(fp), tuple(_vdec(v) for v in fb),
                     [(str(vid), _vdec(v)) for vid, v in vds],
                     int(tok), float(cost), float(sec), str(note))
        if len(row) >= 13:       # reflection records (older records have none)
            a.rationale, a.hypothesis = str(row[8]), str(row[9])
            a.patch, a.expect, a.outcome = _dec(row[10]), tuple(str(x) for x in row[11]), str(row[12])
        st.attempts.append(a)
    src = p.get("regression_src")
    st.regression_src = ([str(x) for x in src] if type(src) is list
                         and len(src) == len(st.regressions) else [""] * len(st.regressions))
    st.unvalidated = p.get("unvalidated") is True
    ctl = p.get("control")
    if ctl is not None:
        st.base, st.below, st.withdrawals = int(ctl[0]), int(ctl[1]), int(ctl[2])
        st.damped, st.escalated = bool(ctl[3]), bool(ctl[4])
    st.fingerprints = {str(k): int(r) for k, r in p["fingerprints"]}
    st.withdrawn = {str(x) for x in p["withdrawn"]}
    st.epoch = int(p["epoch"])
    st.spent_attempts, st.spent_tokens, st.spent_cost = (int(p["spent"][0]),
                                                         int(p["spent"][1]),
                                                         float(p["spent"][2]))
    st.evidence = {tuple(e) for e in p["evidence"]}
    st.stale_streak = int(p["streak"])
    st.events = int(p["events"])
    st.failed_events = int(p["failed_events"])
    st.rejections = int(p["rejections"])
    if p["failed"] is not None:
        reason, report, best, attempts = p["failed"]
        st.failed = NotAccepted(label, str(reason), str(report),
                                None if best is None else st.values.get(int(best)),
                                int(attempts))
    refs = p["refs"]
    if refs is not None and type(refs) is not list:
        raise ValueError("malformed references")
    st.refs = refs
    return st


def _no_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"extension type {code} in a node record")


def _may_adopt(rt, inst, vh: bytes) -> bool:
    """May the stored value (content hash ``vh``) of this LLM node be taken from the store?
    Not when its state says the candidate was withdrawn by a NACK, or the node is not stable."""
    st = _node_of(rt, inst, create=False)
    if st is None:
        return True           # stored entries are accepted candidates
    if st.status in ("invalid", "failed"):
        return False
    for rev, val in st.values.items():
        if rt._hash_value(val) == vh:
            if _fingerprint(val) in st.withdrawn:
                return False
            # an older context's accepted candidate comes back (change and revert); what it
            # rests on is the stored trace now, checked by content hash
            st.candidate, st.revision, st.has_candidate = val, rev, True
            st.status = "stable"
            st.made_under, st.generated_under = {}, ()
    return True


# --- protected acceptance: an audit of the validators' identities, per definition ----------
#
# Validators are outside the model's reach. Their identity (id and version, or a code
# fingerprint) is part of every verdict key and of the node's context key, so a verdict made by
# another version of a validator is never evidence for the current one: it is history. What
# the store adds here is the audit trail: one record per node definition (by its qualified
# name) holding the validators' identities it last ran with, and every change seen, with the
# old and new identity and when.


def _audit_key(rt, node) -> bytes:
    return b"\x00audit:" + _keys.digest("llm", b"audit:" + node._audit_ident.encode(), rt.hash)


def _audit(rt, node) -> None:
    """Compare the node's validators with the store's record of them; record and announce
    every change (events.ValidatorChanged). Nothing to do without a store."""
    if rt.store_path is None:
        return
    key = _audit_key(rt, node)
    old = _read_audit(rt._store_node(key))
    now = {v.id: v.version for v in node.validators}
    if old is not None and old["validators"] == now:
        return
    log = [] if old is None else old["log"]
    if old is not None:
        for vid in sorted(set(old["validators"]) | set(now)):
            a, b = old["validators"].get(vid, ""), now.get(vid, "")
            if a != b:
                log.append([vid, a, b, time.time()])
                _emit(_book(rt), events.ValidatorChanged(node.name, vid, a, b))
    rt._store_put_node(key, _pack_record({"audit": node.name, "label": f"audit:{node.name}",
                                          "validators": now, "log": log[-200:]}))


def _read_audit(data: bytes | None) -> dict | None:
    """An audit record, or None (absent, or damaged: then the audit starts again)."""
    if data is None:
        return None
    try:
        p = _unpack_record(data)
        vals, log = p["validators"], p["log"]
        if type(vals) is not dict or type(log) is not list or not all(
                type(k) is str and type(v) is str for k, v in vals.items()):
            return None
        return {"name": str(p["audit"]), "validators": vals,
                "log": [[str(a), str(b), str(c), float(t)] for a, b, c, t in log]}
    except Exception:
        return None


def audits(store) -> list[dict]:
    """Every recorded change of a validator's identity (for ``incr inspect``): node, validator,
    old and new identity, time."""
    out = []
    for ikey, data in store.iter_nodes():
        a = _read_audit(data) if ikey.startswith(b"\x00audit:") else None
        if a is None:
            continue
        out.extend({"node": a["name"], "validator": vid, "old": o, "new": n, "at": t}
                   for vid, o, n, t in a["log"])
    return sorted(out, key=lambda r: r["at"])


def summaries(store) -> list[dict]:
    """One row per saved LLM node state (for ``incr inspect``): label, status, revision,
    verdicts on the current revision, attempts, failure reason; damaged ones flagged."""
    rows = []
    for ikey, data in store.iter_nodes():
        if ikey.startswith(b"\x00audit:"):
            continue                          # the validators' audit trail (audits())
        try:
            st = _unpack_node(data, "?")
            label = msgpack_label(data)
        except Exception:
            rows.append({"key": ikey.hex(), "label": None, "damaged": True})
            continue
        cur = {"ACK": 0, "NACK": 0, "UNKNOWN": 0}
        for (_vid, _vv, _case, rev), (vs, _d) in st.ledger.items():
            if rev == st.revision:
                for v in vs:
                    cur[v.kind] += 1
        rows.append({"key": ikey.hex(), "label": label, "damaged": False,
                     "status": ("unvalidated" if st.status == "stable" and st.unvalidated
                                else st.status), "revision": st.revision, "verdicts": cur,
                     "attempts": len([a for a in st.attempts if a.revision]),
                     "history": [{"revision": a.revision, "outcome": a.outcome,
                                  "candidate": _text(st.values.get(a.revision), 80),
                                  "rationale": _text(a.rationale, 80),
                                  "hypothesis": _text(a.hypothesis, 80),
                                  "patch": None if a.patch is None else _text(a.patch, 80),
                                  "note": a.note}
                                 for a in st.attempts if a.revision][-10:],
                     "regressions": len(st.regressions),
                     "reason": st.failed.reason if st.failed is not None else None})
    return sorted(rows, key=lambda r: r["label"] or "")


def msgpack_label(data: bytes) -> str:
    import msgpack
    from incr.store import HEADER
    p = msgpack.unpackb(data[HEADER.size:], raw=False, strict_map_key=True, ext_hook=_no_ext)
    lab = p.get("label")
    return lab if type(lab) is str else "?"
