"""The calls an LLM node's loop makes (internal): the model call -- cooldown, deadline,
transport retries, patch mode, run ahead in a worker thread or as an asyncio task -- and the
validator and recheck calls, whose verdicts go into the ledger. _Calls is the half of
incr._llm_loop._Loop that makes them; it uses the loop's exit _fail and its _over_budget and
_basis.

Invariants it keeps:
- every call gets its own copy of the node's arguments (args, kwargs): what one call does to
  them, no other call sees;
- no model call starts while the runtime is halted (_halt_point before each, and start() in
  whichever thread or task makes it); what was generated ahead for a halted loop is dropped,
  unless that call returned before the halt (a call made, kept as a serial pass keeps it);
- a model call counts once: claimed from the runtime-wide budget when it starts, announced
  (GenerationFinished) and its spend added once, where it ended (_Ticket.finished); a call
  refused, or interrupted before the model was called, is no attempt;
- an outcome made ahead is used only if everything it read is unchanged, and its reads are
  replayed as this run's dependencies;
- a validator that raises, times out or returns what is not a verdict gives UNKNOWN, never
  NACK; every regression case is re-checked on every revision, or is UNKNOWN.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import time
from typing import Any, Callable

from incr import events
from incr import keys as _keys
from incr import _aio
from incr import _core
from incr.errors import NotAccepted, Reject, _Deferred, _OutOfTime, _Suspend
from incr._llm_book import _GraphBudget, _emit, _graph_figures, _graph_spent, _graph_take
from incr._llm_ledger import _attempt_of, _best, _ledger_add
from incr._llm_report import _report
from incr._llm_types import (ACK, NACK, UNKNOWN, _NOTHING, _VERDICTS, Candidate, Validator,
                             _Attempt, _awaitable_problem, _cex_key, _fingerprint, _short,
                             _usable)


_TRANSIENT_NAMES = {"RateLimitError", "APIConnectionError", "APITimeoutError",
                    "InternalServerError", "ServiceUnavailableError", "Timeout"}


def _transient(e: BaseException) -> bool:
    """A rate-limit or transport failure of the generator: retried, never fed back."""
    if isinstance(e, (ConnectionError, TimeoutError)):
        return True
    if type(e).__name__ in _TRANSIENT_NAMES:
        return True
    return getattr(e, "status_code", None) in (408, 409, 429, 500, 502, 503, 504)


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


class _Calls:
    """The calls of one run of a node instance's loop: the base of _Loop (internal)."""

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

    # -- the model call -----------------------------------------------------------------------

    def _generate(self) -> Any:
        st, node = self.st, self.node
        feedback = self._feedback()
        previous = self._previous()
        delay = node.backoff
        while True:
            self._halt_point(previous, feedback)        # rt.halt: no model call from here
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

    def _halt_point(self, previous: Any = _NOTHING, feedback: tuple = ()) -> None:
        """Right before a generator call: if the runtime is halted (rt.halt), stop the loop
        with NotAccepted("halted") and record nothing more. The node keeps its state (no
        failure is remembered: after rt.resume() the same demand generates), and what a
        worker thread generated ahead for it is dropped, so a halted loop never takes a new
        candidate -- unless that call (``previous``, ``feedback``) had RETURNED before the
        halt: it is not a next call but one made already, and is taken as a serial pass would
        have (a call that returned after the halt is not kept: ahead() in _call_gen)."""
        reason = self.rt.halt_reason
        if reason is None:
            return
        st = self.st
        if previous is not _NOTHING and st.prefetched and self._key(previous, feedback) \
                in st.prefetched:
            return
        st.prefetched.clear()
        self.cut_short = True
        self.book.halted.add(self.inst)     # made stale, with its readers, after rt.resume()
        _emit(self.book, events.Halted(st.label, "halted", reason))
        raise NotAccepted(st.label, "halted", _report(self.node, st, "halted", None, reason),
                          _best(st), st.spent_attempts)

    def _key(self, previous: Any, feedback: tuple) -> tuple:
        """The key of the generator call on ``previous`` with ``feedback`` (st.prefetched)."""
        return (_fingerprint(previous) if self.st.has_candidate else None,
                tuple(_cex_key(v) for v in feedback))

    def _call_gen(self, previous: Any, feedback: tuple) -> Callable[[], Any]:
        """The generator call to make: a result that ran ahead in a worker thread (its reads
        replayed here, so they are recorded as this run's dependencies), or a direct call.
        Inside a stabilize that gathers calls, a call not yet made is set aside instead."""
        st, node, rt = self.st, self.node, self.rt
        key = self._key(previous, feedback)
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
                out = call()
                if rt.halt_reason is not None:
                    # halted while the call was in flight: its outcome is not kept (the
                    # halt drops what returns after it); the serial pass meets the halt
                    raise _Deferred(st.label)
                return out
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
