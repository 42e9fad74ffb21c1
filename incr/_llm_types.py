"""incr.llm's data (internal; the public names are re-exported by incr.llmnodes and incr).

The verdicts (ACK, NACK, UNKNOWN), Candidate, Budget, Acceptance, Validator and NodeState; the
records the loop keeps per node instance (_Node) and per attempt (_Attempt); the checks of what a
verdict may hold; the fingerprints that identify a candidate and a counterexample.

Invariants it keeps:
- a verdict's text fields (case, message, reason) are str and valid UTF-8 from the moment it is
  made (TypeError otherwise); a payload incr cannot keep is never recorded as it is -- _usable
  turns such a verdict into an UNKNOWN that says why;
- a Candidate's tokens and cost are >= 0 and finite, and a Budget's limits positive or None
  (never NaN): what budgets add up never refills or switches one off;
- a Validator's identity (id, version) is the same in every process: its version is a str or
  an int, or else the fingerprint of its code;
- _fingerprint is total: a value the codec cannot encode is fingerprinted by its repr.
The lowest of the incr.llm modules: it imports incr.keys and incr._core, none of the others.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Iterable

import attrs

from incr import keys as _keys
from incr import _core


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


# --- candidate identity (what repetition and feedback compare) -----------------------------


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
