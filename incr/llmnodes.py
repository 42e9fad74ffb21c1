"""LLM nodes: memoized generators that become stable only under validator evidence.

An LLM node is a cell whose function is a control loop around a generator (the model call)
and validators (checks outside the model). It lives in the same trace as every other cell:
what its generator and validators read are its dependencies, its accepted candidate is its
value, and its readers are withdrawn through the same propagation as after an input change.

This module is the public face: LLMNode, ``llm()``, ``effect()``, and the hooks the core and
the runtime call (``from incr import llmnodes as _llm``; ``_llm.state``, ``_llm.halt``,
``_llm.outside_verdict``, ``_llm._absorb_reject``, ``_llm.effect_read``, ...). Its invariants:
an argument is checked before anything changes (a refused outside verdict leaves the node, its
ledger and the store as they were); an effect runs only on stable LLM nodes. The rest lives in
private modules, each lower one imported by the higher ones only:

    incr/_llm_types.py   ACK, NACK, UNKNOWN, Candidate, Budget, Acceptance, Validator,
                         NodeState, the per-instance records (_Node, _Attempt), fingerprints
    incr/_llm_book.py    the bookkeeping on one runtime (rt.llm): events, runtime-wide budgets
    incr/_llm_ledger.py  the verdict ledger, the acceptance decision, outside verdicts, evidence
    incr/_llm_report.py  FailureReport and the readable report of a loop that stopped
    incr/_llm_store.py   the node's state in the store, the validators' audit trail
    incr/_llm_calls.py   the calls a loop makes: the model call, validators, rechecks
    incr/_llm_loop.py    _Loop: the control loop (generate, validate, decide, stop)

Every name this module had before the split is still importable from it where code outside
uses it (the re-exports below).
"""

from __future__ import annotations

import functools
import inspect
import time
from typing import Callable

from incr import keys as _keys
from incr import _core
from incr import errors as _errors
from incr import events
from incr._core import EQUAL, Cell, Instance, current
from incr.errors import IncrError, Reject
from incr._llm_types import (NACK, Acceptance, Budget, NodeState, Validator, _Node,
                             _field_problem, _is_async, _refuse_async, _short, _verdict_problem)
from incr._llm_book import _book, _emit
from incr._llm_ledger import _acked_now, _note, _restore, _snapshot
from incr._llm_store import _node_of, _save
from incr._llm_loop import _Loop

# re-exported: the names code outside imports from incr.llmnodes (incr/__init__.py, incr.cli,
# incr.graph, incr.openai_chat, adapters/, tests/, the core's ``_llm.NAME`` calls)
from incr._llm_types import ACK, UNKNOWN, Candidate, validator  # noqa: F401 -- re-exported
from incr._llm_types import _DefaultAttempts  # noqa: F401 -- re-exported (see below)
from incr._llm_ledger import _evidence  # noqa: F401 -- re-exported
from incr._llm_report import FailureReport  # noqa: F401 -- re-exported
from incr._llm_store import _may_adopt, _unpack_node, msgpack_label  # noqa: F401 -- re-exported
from incr._llm_store import audits, summaries  # noqa: F401 -- re-exported
from incr._llm_calls import _transient  # noqa: F401 -- re-exported

# These classes (what users hold instances of) keep the module that defined them before the
# split, incr.llmnodes: it is part of what names them -- their repr, pickle, and
# keys.closure_fingerprint, which names a value it cannot encode by its type's module and
# qualname (so a cell closing over a Validator or a Budget keeps its identity, and its store
# entries, across the split; a Budget pickled before it still loads: its max_attempts default
# is a _DefaultAttempts).
for _cls in (ACK, NACK, UNKNOWN, Acceptance, Budget, Candidate, FailureReport, NodeState,
             Validator, _DefaultAttempts):
    _cls.__module__ = __name__
del _cls

__all__ = ["ACK", "NACK", "UNKNOWN", "Acceptance", "Budget", "Candidate", "LLMNode",
           "NodeState", "Validator", "effect", "llm", "validator"]

# (re-exported for code outside: incr.errors, incr.cli, incr.graph, incr.demo_sql,
# incr.openai_chat, adapters/, tests/ and the core's ``_llm.NAME`` calls)
_REEXPORTED = (ACK, NACK, UNKNOWN, Candidate, Validator, validator, FailureReport, _evidence,
               _may_adopt, _unpack_node, audits, msgpack_label, summaries, _transient, _Loop,
               _node_of, _field_problem, _short, Cell)


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


# --- the node --------------------------------------------------------------------------------


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


def _consumed(node, args) -> int | None:
    """The revision of node(*args) that the running computation consumed (for Reject)."""
    try:
        rt = current()
        inst = rt._instance(node, args, {}, create=False)
        st = None if inst is None or rt.llm is None else rt.llm.nodes.get(inst)
        return None if st is None else st.revision
    except Exception:
        return None


def _reject_args(node, args: tuple, case, counterexample, message) -> tuple:
    """``incr.Reject(node, *args, case=, counterexample=, message=)`` is being made: a TypeError
    unless ``node`` is an LLM node and every field is one a verdict can hold; else (the
    revision of node(*args) the running computation consumed, the label of that computation),
    each None when unknown. incr.errors calls it as ``errors._reject_args`` (set below), so
    that errors.py imports nothing of incr."""
    if not isinstance(node, LLMNode):
        what = ("a plain cell, which cannot generate again"
                if isinstance(node, Cell) else _short(node))
        raise TypeError(f"incr.Reject: the first argument must be the LLM node (@incr.llm) "
                        f"whose candidate is wrong, got {what}; raise an ordinary exception "
                        f"to fail a computation instead")
    for name, value in (("case", case), ("counterexample", counterexample),
                        ("message", message)):
        problem = _field_problem(name, value)
        if problem is not None:
            raise TypeError(f"incr.Reject: {problem}")
    # the revision consumed, and by whom: known now, while the rejecting computation runs
    try:
        revision = _consumed(node, args)
        running = current()._running()
        return revision, None if running is None else running.label_text
    except Exception:
        return None, None


_errors._reject_args = _reject_args


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
