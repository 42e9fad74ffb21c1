"""The control loop of one LLM node instance (internal): ``_Loop(node, args, kwargs).run()`` is
the node's cell function, run inside its frame.

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

The calls themselves (generator, validators, rechecks) are _Calls' (incr._llm_calls).

Invariants it keeps:
- a switch of the node's state (a new context, a fresh budget, a new revision, a reused or
  escalated candidate, a stop) is undone as a whole if interrupted before the run settles
  (_switch_state, _put_back): the next run sees the same change and makes it again;
- what a run read is kept (st.snapshot) only when it looked at every change since the last
  run; the store's record is written only by a run that ended (not set aside, not cut short
  at a generator call);
- on_failure is asked at most once per budget, and an escalated candidate is validated like
  any other.
"""

from __future__ import annotations

import operator
import time
from typing import Any

from incr import events
from incr._core import current
from incr.errors import NotAccepted, _Deferred
from incr._llm_book import _book, _emit
from incr._llm_calls import _Calls
from incr._llm_ledger import (_acked_by_revision, _attempt_of, _best, _cases, _decision,
                              _verdicts_for)
from incr._llm_report import FailureReport, _report
from incr._llm_store import _audit, _node_of, _save
from incr._llm_types import (_DEFAULT_ATTEMPTS, NACK, Candidate, _Attempt, _Node,
                             _awaitable_problem, _fingerprint, _repeat_fp)


class _Loop(_Calls):
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


class _Escalated(Exception):
    """Internal: on_failure supplied a candidate that was accepted; run() returns it."""

    def __init__(self, value: Any):
        super().__init__("incr: accepted after on_failure")
        self.value = value
