"""The feedback loop of the design notes, outside the model: reflection records, keep or
revert, patches, regression cases re-checked, reuse by re-validation, repetition with
normalize, divergence, cooldown and hysteresis, the runtime-wide budget, typed events,
escalation, spot checks, and statuses. Every test counts generator and validator calls."""

from __future__ import annotations

import logging
import threading
import warnings

import pytest

import incr
from incr import events
from incr import llmnodes


class Script:
    """A scripted generator: answers in order (the last repeats); records previous/feedback."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.calls = []
        self.lock = threading.Lock()

    def __call__(self, *args, previous=None, feedback=()):
        with self.lock:
            self.calls.append({"args": args, "previous": previous, "feedback": feedback})
            a = self.answers[min(len(self.calls), len(self.answers)) - 1]
        if isinstance(a, BaseException):
            raise a
        return a


def make(script, **kw):
    @incr.llm(**kw)
    def node(x, *, previous=None, feedback=()):
        return script(x, previous=previous, feedback=feedback)
    return node


def cases(*names, log=None, version="1"):
    """A validator: for each case name, ACK if the candidate holds "+name", NACK (with a
    counterexample) if it holds "-name", no verdict on it otherwise."""
    @incr.validator(version=version)
    def check(candidate, x):
        text = candidate.value if isinstance(candidate, incr.Candidate) else candidate
        if log is not None:
            log.append(text)
        for n in names:
            if f"+{n}" in text:
                yield incr.ACK(n)
            elif f"-{n}" in text:
                yield incr.NACK(n, counterexample={"case": n, "in": text},
                                message=f"make {n} pass")
    return check


def collect(rt):
    got = []
    rt.on_event(got.append)
    return got


# --- reflection records (seed 001) ----------------------------------------------------------


def test_reflection_records_are_kept_per_attempt_and_shown_everywhere(tmp_path):
    s = Script(incr.Candidate("v1 +a -b", rationale="first try"),
               incr.Candidate("v2 +a +b", tokens=7, rationale="b needs a join",
                              hypothesis="the join drops refunded rows", patch="@@ -1 +1 @@",
                              expect="b"))
    node = make(s, validators=[cases("a", "b")], version="r")
    rt = incr.Runtime(store=str(tmp_path / "s"))
    with rt:
        assert node(0) == "v2 +a +b"
    at = rt.state(node, 0).attempts
    assert [a["revision"] for a in at] == [1, 2]
    assert [a["outcome"] for a in at] == ["rejected", "accepted"]
    assert at[0]["rationale"] == "first try" and at[0]["candidate"] == "v1 +a -b"
    assert (at[1]["hypothesis"], at[1]["patch"], at[1]["expect"], at[1]["tokens"]) == \
        ("the join drops refunded rows", "@@ -1 +1 @@", ("b",), 7)
    assert [f.case for f in at[1]["feedback"]] == ["b"]          # the symptom it answered
    assert {(vid.rsplit(".", 1)[-1], v.kind) for vid, v in at[0]["verdicts"]} == \
        {("check", "ACK"), ("check", "NACK")}
    rt.close()
    again = incr.Runtime(store=str(tmp_path / "s"))                # the store keeps them
    at2 = again.state(node, 0).attempts
    assert [(a["rationale"], a["hypothesis"], a["outcome"]) for a in at2] == \
        [("first try", "", "rejected"), ("b needs a join", "the join drops refunded rows",
                                         "accepted")]
    again.close()


def test_the_report_shows_candidates_rationales_verdicts_and_a_next_step(rt):
    s = Script(incr.Candidate("v1 -a", rationale="guess one"), "v2 -a", "v3 -a")
    node = make(s, validators=[cases("a")], budget=incr.Budget(max_attempts=3), patience=9)
    with rt, pytest.raises(incr.NotAccepted) as ei:
        node(0)
    r = ei.value.report
    assert "candidate: v1 -a" in r and "rationale: guess one" in r
    assert "counterexample={'case': 'a', 'in': 'v2 -a'}" in r and "next step:" in r
    assert ei.value.reason == "budget" and len(s.calls) == 3


# --- keep or revert -----------------------------------------------------------------------


def test_a_regression_is_reverted_and_the_next_generation_starts_from_the_best(rt):
    # r1 ACKs a, NACKs b; r2 loses a (NACK) and still fails b: worse -> reverted;
    # r3 is generated from r1, not r2, with the regression's counterexample fed back
    s = Script("r1 +a -b", "r2 -a -b", "r3 +a +b")
    node = make(s, validators=[cases("a", "b")], budget=incr.Budget(max_attempts=5),
                patience=5)
    got = collect(rt)
    with rt:
        assert node(0) == "r3 +a +b"
    assert [c["previous"] for c in s.calls] == [None, "r1 +a -b", "r1 +a -b"]
    assert {f.case for f in s.calls[2]["feedback"]} >= {"a", "b"}
    at = rt.state(node, 0).attempts
    assert [a["outcome"] for a in at] == ["rejected", "reverted", "accepted"]
    reg = [e for e in got if isinstance(e, events.Regression)]
    rev = [e for e in got if isinstance(e, events.Reverted)]
    assert len(reg) == 1 and reg[0].revision == 2 and reg[0].best == 1
    assert [c for _v, c in reg[0].lost] == ["a"]
    assert [(e.revision, e.to) for e in rev] == [(2, 1)]


def test_a_regression_that_is_still_the_best_is_kept(rt):
    # r2 loses a but gains b and c: strictly better, so it is built on (no revert)
    s = Script("r1 +a -b -c", "r2 -a +b +c", "r3 +a +b +c")
    node = make(s, validators=[cases("a", "b", "c")])
    got = collect(rt)
    with rt:
        assert node(0) == "r3 +a +b +c"
    assert s.calls[2]["previous"] == "r2 -a +b +c"
    assert any(isinstance(e, events.Regression) for e in got)
    assert not any(isinstance(e, events.Reverted) for e in got)


# --- minimal patches ----------------------------------------------------------------------


def test_patch_mode_applies_the_patch_and_revalidates_everything(rt):
    log = []

    def apply(previous, patch):
        old, new = patch
        if old not in previous:
            raise ValueError(f"{old!r} is not in the previous answer")
        return previous.replace(old, new)

    s = Script("base +a -b", ("-b", "+b"))
    node = make(s, validators=[cases("a", "b", log=log)], apply=apply)
    with rt:
        assert node(0) == "base +a +b"
    assert len(s.calls) == 2 and s.calls[1]["previous"] == "base +a -b"
    assert log == ["base +a -b", "base +a +b"]       # the protective case a checked again
    at = rt.state(node, 0).attempts
    assert at[1]["patch"] == ("-b", "+b") and at[1]["outcome"] == "accepted"


def test_a_patch_that_does_not_apply_is_fed_back_and_costs_an_attempt(rt):
    def apply(previous, patch):
        old, new = patch
        if old not in previous:
            raise ValueError(f"{old!r} is not in the previous answer")
        return previous.replace(old, new)

    s = Script("base -b", ("nope", "x"), ("-b", "+b"))
    node = make(s, validators=[cases("b")], apply=apply)
    with rt:
        assert node(0) == "base +b"
    assert len(s.calls) == 3
    fed = [f.case for f in s.calls[2]["feedback"]]
    assert "incr.patch" in fed and s.calls[2]["previous"] == "base -b"
    notes = [a["note"] for a in rt.state(node, 0).attempts]
    assert any("did not apply" in n for n in notes)


def test_patch_mode_accepts_a_full_answer_as_a_candidate_without_patch(rt):
    s = Script("base -b", incr.Candidate("rewritten +b"))      # fell back to a full answer
    node = make(s, validators=[cases("b")], apply=lambda p, d: 1 / 0)
    with rt:
        assert node(0) == "rewritten +b"


# --- regression cases re-checked -------------------------------------------------------------


def test_a_case_the_validator_no_longer_checks_is_unknown_not_fixed(rt):
    # r1 NACKs b; r2 says nothing about b (only ACKs a): b is UNKNOWN, not assumed fixed
    s = Script("r1 +a -b", "r2 +a")
    node = make(s, validators=[cases("a", "b")], budget=incr.Budget(max_attempts=2))
    with rt, pytest.raises(incr.NotAccepted) as ei:
        node(0)
    assert ei.value.reason == "unknown"
    checks = rt.state(node, 0).checks
    unk = [v for (vid, _vv, case, rev), v in checks.items() if rev == 2 and case == "b"]
    assert [v.kind for v in unk] == ["UNKNOWN"] and "regression case" in unk[0].reason


def test_a_case_checked_again_and_passed_lets_the_candidate_through(rt):
    s = Script("r1 +a -b", "r2 +a +b")
    node = make(s, validators=[cases("a", "b")])
    with rt:
        assert node(0) == "r2 +a +b"


def test_an_rt_nack_case_nothing_can_recheck_is_shown_as_unknown(rt):
    s = Script("first", "second")
    node = make(s)
    with rt:
        node(0)
    rt.nack(node, 0, revision=1, case="tone", counterexample={"said": "first"})
    with rt:
        assert node(0) == "second"
    checks = rt.state(node, 0).checks
    assert checks[("regression", "", "tone", 2)].kind == "UNKNOWN"


# --- reuse by re-validation ------------------------------------------------------------------


def test_reuse_revalidate_takes_the_last_accepted_candidate_only_on_its_own_evidence(rt):
    log = []
    s = Script("shared +a")
    node = make(s, validators=[cases("a", log=log)], reuse="revalidate")
    with rt:
        assert node(1) == "shared +a"
        assert node(2) == "shared +a"           # validated here, no model call
    assert len(s.calls) == 1 and log == ["shared +a", "shared +a"]
    st2 = rt.state(node, 2)
    assert st2.status == "stable" and st2.attempts[0]["note"].startswith("reused from")
    assert any(k[3] == 1 and v.kind == "ACK" for k, v in st2.checks.items())


def test_reuse_revalidate_generates_when_the_reused_candidate_fails_here(rt):
    @incr.validator(version="1")
    def fits(candidate, x):
        yield incr.ACK("fits") if candidate.endswith(str(x)) else incr.NACK(
            "fits", counterexample={"x": x})

    s = Script("for 1", "for 2")
    node = make(s, validators=[fits], reuse="revalidate")
    with rt:
        assert node(1) == "for 1"
        assert node(2) == "for 2"
    assert len(s.calls) == 2 and s.calls[1]["previous"] == "for 1"
    assert [f.case for f in s.calls[1]["feedback"]] == ["fits"]


def test_reuse_is_off_by_default_and_never_without_validators(rt):
    s = Script("a", "b")
    plain = make(s)
    t = Script("c", "d")
    unvalidated = make(t, reuse="revalidate")
    with rt:
        plain(1), plain(2), unvalidated(1), unvalidated(2)
    assert len(s.calls) == 2 and len(t.calls) == 2


# --- repetition, divergence ------------------------------------------------------------------


def test_a_candidate_equal_after_normalize_that_is_rejected_is_a_repetition(rt):
    s = Script("SELECT x -a", "select   X -a", "never")
    node = make(s, validators=[cases("a")])
    with rt, pytest.raises(incr.NotAccepted) as ei:
        node(0)
    assert ei.value.reason == "oscillation" and len(s.calls) == 2
    assert "after normalize" in ei.value.report


def test_a_candidate_equal_after_normalize_that_passes_is_accepted(rt):
    @incr.validator(version="1")
    def upper(candidate, x):
        yield incr.ACK("upper") if candidate.startswith("SELECT") else incr.NACK(
            "upper", counterexample=candidate)

    s = Script("select 1", "SELECT 1")
    node = make(s, validators=[upper])
    with rt:
        assert node(0) == "SELECT 1"


def test_normalize_decides_what_a_repetition_is(rt):
    s = Script("a 1 -x", "a 2 -x", "a 3 -x")
    node = make(s, validators=[cases("x")], normalize=lambda c: c.split()[0])
    with rt, pytest.raises(incr.NotAccepted) as ei:
        node(0)
    assert ei.value.reason == "oscillation" and len(s.calls) == 2


def test_divergence_stops_after_patience_revisions_below_the_best(rt):
    s = Script("r1 +a +b -c", "r2 +a -b -c", "r3 -a +b -c", "r4 never")
    node = make(s, validators=[cases("a", "b", "c")], patience=2,
                budget=incr.Budget(max_attempts=10))
    got = collect(rt)
    with rt, pytest.raises(incr.NotAccepted) as ei:
        node(0)
    assert ei.value.reason == "divergence" and len(s.calls) == 3
    assert ei.value.best == "r1 +a +b -c"
    assert any(isinstance(e, events.Warning) and e.monitor == "patience" for e in got)


# --- damping: cooldown, hysteresis ------------------------------------------------------------


def test_cooldown_waits_between_two_attempts_of_a_node(rt, monkeypatch):
    waits = []
    monkeypatch.setattr(llmnodes.time, "sleep", lambda s: waits.append(s))
    s = Script("-a", "+a")
    node = make(s, validators=[cases("a")], budget=incr.Budget(cooldown=30))
    with rt:
        assert node(0) == "+a"
    assert len(waits) == 1 and 29 < waits[0] <= 30      # before the second call only


def test_a_cooldown_that_would_pass_max_seconds_ends_the_loop(rt):
    s = Script("-a", "+a")
    node = make(s, validators=[cases("a")], budget=incr.Budget(cooldown=60, max_seconds=5))
    with rt, pytest.raises(incr.NotAccepted) as ei:
        node(0)
    assert ei.value.reason == "budget" and "cooldown" in ei.value.report and len(s.calls) == 1


def test_hysteresis_keeps_a_flapping_node_withdrawn_until_its_context_changes(rt):
    x = rt.input("x", 0)
    s = Script("a", "b", "c", "d")

    @incr.llm(budget=incr.Budget(max_withdrawals=1, max_attempts=9))
    def node(k, *, previous=None, feedback=()):
        return s(x.get(), previous=previous, feedback=feedback)

    with rt:
        assert node(0) == "a"
        rt.nack(node, 0, revision=1, case="no", counterexample=1)
        assert node(0) == "b"
        rt.nack(node, 0, revision=2, case="no", counterexample=2)
        with pytest.raises(incr.NotAccepted) as ei:
            node(0)
        assert ei.value.reason == "oscillation" and "withdrawn 2 times" in ei.value.report
        rt.ack(node, 0, revision=2, case="fine")      # new evidence does not lift it
        with pytest.raises(incr.NotAccepted):
            node(0)
        assert len(s.calls) == 2
        x.set(1)                                       # the context changes: it runs again
        assert node(0) == "c"
    assert len(s.calls) == 3


# --- the runtime-wide budget ---------------------------------------------------------------


def test_a_runtime_budget_stops_the_node_that_would_exceed_it():
    rt = incr.Runtime(budget=incr.Budget(max_attempts=4))
    g1, g2 = Script("-a", "+a"), Script("-a", "-a again", "+a")
    n1 = make(g1, validators=[cases("a")])
    n2 = make(g2, validators=[cases("a")])
    with rt:
        assert n1(0) == "+a"                 # 2 calls
        with pytest.raises(incr.NotAccepted) as ei:
            n2(0)                            # 2 more calls; the third would exceed 4
    assert ei.value.reason == "budget" and "runtime" in ei.value.report
    assert len(g1.calls) + len(g2.calls) == 4
    rt._check()


def test_a_runtime_budget_holds_under_concurrent_first_runs():
    rt = incr.Runtime(budget=incr.Budget(max_attempts=3), max_workers=4)
    gens = [Script("ok") for _ in range(6)]
    nodes = [make(g, version=f"n{i}") for i, g in enumerate(gens)]
    obs = [rt.observe(n, 0) for n in nodes]
    with pytest.raises(incr.NotAccepted):
        rt.stabilize()
    assert sum(len(g.calls) for g in gens) == 3
    reasons = [o.error.reason for o in obs if o.error is not None]
    assert reasons == ["budget"] * 3
    rt._check()


def test_a_runtime_budget_of_tokens_counts_every_node():
    rt = incr.Runtime(budget=incr.Budget(max_tokens=25))
    g = Script(incr.Candidate("x", tokens=10))
    n = make(g)
    with rt:
        n(1), n(2), n(3)                     # 30 tokens: the third call began under 25
        with pytest.raises(incr.NotAccepted) as ei:
            n(4)
    assert ei.value.reason == "budget" and "tokens 30 of 25" in ei.value.report
    assert len(g.calls) == 3


def test_runtime_budget_and_on_failure_are_checked():
    with pytest.raises(TypeError, match="budget must be an incr.Budget"):
        incr.Runtime(budget=5)
    with pytest.raises(TypeError, match="on_failure must be callable"):
        incr.Runtime(on_failure="human")


# --- events ----------------------------------------------------------------------------------


def test_events_tell_the_story_of_a_loop(rt):
    s = Script("-a", "+a")
    node = make(s, validators=[cases("a")])
    got = collect(rt)
    with rt:
        node(0)
    kinds = [type(e).__name__ for e in got]
    assert kinds == ["GenerationStarted", "GenerationFinished", "ValidationFinished", "Verdict",
                     "GenerationStarted", "GenerationFinished", "ValidationFinished", "Verdict",
                     "Accepted"]
    assert got[3].verdict.kind == "NACK" and got[7].verdict.kind == "ACK"
    assert got[2].verdicts == ("NACK",) and got[6].verdicts == ("ACK",)
    assert got[-1].revision == 2 and all(e.label == "node(0)" for e in got)
    rt.nack(node, 0, revision=2, case="late", counterexample=1)
    assert isinstance(got[-1], events.Withdrawn) and got[-1].revision == 2


def test_a_warning_comes_before_the_budget_stops_a_loop_and_then_stopped(rt):
    s = Script("-a 1", "-a 2", "-a 3", "-a 4", "-a 5")
    node = make(s, validators=[cases("a")], budget=incr.Budget(max_attempts=5), patience=9)
    got = collect(rt)
    with rt, pytest.raises(incr.NotAccepted):
        node(0)
    w = [e for e in got if isinstance(e, events.Warning)]
    assert [(e.monitor, e.used, e.limit) for e in w] == [("attempts", 4, 5)]
    assert isinstance(got[-1], events.Stopped) and got[-1].reason == "budget"


def test_unsubscribe_and_a_raising_callback_never_change_the_loop(rt):
    s = Script("+a")
    node = make(s, validators=[cases("a")])
    got = []
    off = rt.on_event(got.append)
    rt.on_event(lambda e: 1 / 0)
    with rt, pytest.warns(RuntimeWarning, match="on_event callback"):
        assert node(0) == "+a"
    n = len(got)
    off()
    with rt, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        node(1)
    assert len(got) == n
    with pytest.raises(TypeError, match="callback must be callable"):
        rt.on_event(42)


def test_events_go_to_the_incr_llm_logger(rt, caplog):
    s = Script("+a")
    node = make(s, validators=[cases("a")])
    with caplog.at_level(logging.DEBUG, logger="incr.llm"), rt:
        node(0)
    assert any("Accepted" in r.getMessage() for r in caplog.records)


# --- escalation -------------------------------------------------------------------------------


def test_on_failure_gets_the_report_and_its_candidate_is_validated(rt):
    log, seen = [], []
    s = Script("-a 1", "-a 2")

    def human(err):
        seen.append(err)
        return "human +a"

    node = make(s, validators=[cases("a", log=log)], budget=incr.Budget(max_attempts=2),
                on_failure=human)
    with rt:
        assert node(0) == "human +a"
    assert len(seen) == 1 and seen[0].reason == "budget" and "-a 2" in seen[0].report
    assert log[-1] == "human +a" and len(s.calls) == 2
    at = rt.state(node, 0).attempts
    assert at[-1]["note"].startswith("supplied by on_failure") and at[-1]["outcome"] == "accepted"


def test_on_failure_is_asked_once_and_a_bad_candidate_keeps_the_failure(rt):
    calls = []
    s = Script("-a 1")
    node = make(s, validators=[cases("a")], budget=incr.Budget(max_attempts=1),
                on_failure=lambda e: calls.append(e) or "still -a")
    with rt:
        with pytest.raises(incr.NotAccepted) as ei:
            node(0)
        with pytest.raises(incr.NotAccepted):
            node(0)
    assert ei.value.reason == "budget" and len(calls) == 1


def test_the_runtime_default_on_failure_applies_to_every_node():
    rt = incr.Runtime(on_failure=lambda e: "fallback +a")
    s = Script("-a")
    node = make(s, validators=[cases("a")], budget=incr.Budget(max_attempts=1))
    with rt:
        assert node(0) == "fallback +a"


# --- spot checks -------------------------------------------------------------------------------


def test_recheck_every_revisions_reruns_the_validators_and_withdraws_on_a_nack():
    rt = incr.Runtime()
    world = {"ok": True}
    log = []

    @incr.validator(version="1")
    def still_true(candidate, x):
        log.append(candidate)
        yield incr.ACK("true") if world["ok"] or candidate == "second" else incr.NACK(
            "true", counterexample="moved")

    s = Script("first", "second")
    node = make(s, validators=[still_true], recheck_every=("revisions", 2))
    other = rt.input("other", 0)
    o = rt.observe(node, 0)
    rt.stabilize()
    assert o.value == "first" and log == ["first"]
    other.set(1)
    rt.stabilize()
    assert log == ["first"]                   # one revision: not due yet
    other.set(2)
    rt.stabilize()
    assert log == ["first", "first"] and len(s.calls) == 1    # re-checked, still true
    world["ok"] = False
    other.set(3), other.set(4)
    rt.stabilize()
    assert log[-2:] == ["first", "second"]     # the spot check NACKed; the new one passed
    assert o.value == "second" and len(s.calls) == 2
    rt._check()


def test_recheck_every_is_checked():
    with pytest.raises(ValueError, match="recheck_every"):
        make(Script("a"), validators=[cases("a")], recheck_every=("minutes", 1))
    with pytest.raises(ValueError, match="needs validators"):
        make(Script("a"), recheck_every=("revisions", 1))


# --- statuses ----------------------------------------------------------------------------------


def test_readers_of_a_withdrawn_node_report_invalid_until_they_run_again(rt):
    s = Script("first +z", "second +z")
    node = make(s, validators=[cases("z")])

    @incr.cell
    def reader(k):
        return node(k) + "!"

    t = Script(" up")

    @incr.llm(validators=[cases("z")])
    def upper(k, *, previous=None, feedback=()):
        return node(k) + t(k, previous=previous, feedback=feedback)

    with rt:
        reader(0), upper(0)
    assert rt.state(reader, 0).status == "stable" and rt.state(upper, 0).status == "stable"
    rt.nack(node, 0, revision=1, case="bad", counterexample=1)
    assert rt.state(reader, 0).status == "invalid"
    assert rt.state(upper, 0).status == "invalid"
    with rt:
        assert reader(0) == "second +z!"
    assert rt.state(reader, 0).status == "stable"


def test_a_node_without_validators_is_unvalidated(rt):
    node = make(Script("a"))
    with rt:
        node(0)
    assert rt.state(node, 0).status == "unvalidated"


def test_patch_true_applies_a_unified_diff_to_text(rt):
    from incr.patches import make_patch
    first = "SELECT id\nFROM orders\nWHERE paid -a\n"
    fixed = "SELECT id\nFROM orders\nWHERE paid +a\n"
    s = Script(first, make_patch(first, fixed))
    node = make(s, validators=[cases("a")], patch=True)
    with rt:
        assert node(0) == fixed
    at = rt.state(node, 0).attempts
    assert at[1]["patch"].startswith("---") or "@@" in at[1]["patch"]
    assert incr.events.Accepted is events.Accepted


def test_patch_true_refuses_a_patch_for_something_not_text(rt):
    s = Script(["-a"], "patch", "never")
    node = make(s, patch=True, validators=[cases("a")], budget=incr.Budget(max_attempts=2))
    with rt, pytest.raises(incr.NotAccepted):
        node(0)
    assert "apply=callable" in rt.state(node, 0).attempts[1]["note"]


# --- protected acceptance: validator identity changes are audited -----------------------------


def test_a_changed_validator_is_an_audit_event_and_its_verdicts_are_history(tmp_path):
    from incr.llmnodes import audits
    path = str(tmp_path / "s")

    def build(version):
        @incr.validator(version=version)
        def judge(candidate, x):
            yield incr.ACK("ok")

        s = Script("answer")

        @incr.llm(validators=[judge], version="n")
        def node(x, *, previous=None, feedback=()):
            return s(x, previous=previous, feedback=feedback)
        return node, s

    node, s = build("1")
    rt = incr.Runtime(store=path)
    with rt:
        node(0)
    rt.close()
    node2, s2 = build("2")
    rt = incr.Runtime(store=path)
    got = collect(rt)
    with rt:
        assert node2(0) == "answer"
    assert len(s2.calls) == 1           # version 1's ACK is history: the node ran again
    changed = [e for e in got if isinstance(e, events.ValidatorChanged)]
    assert [(e.old, e.new) for e in changed] == [("1", "2")]
    rt.close()
    from incr.store import Store

    def read():
        st = Store(path, count_run=False, create=False)
        try:
            return audits(st)
        finally:
            st.close()
    rows = read()
    assert [(r["old"], r["new"]) for r in rows] == [("1", "2")]
    assert rows[0]["validator"].endswith("judge")
    rt = incr.Runtime(store=path)        # the same identity again: no new audit entry
    with rt:
        node2(0)
    rt.close()
    assert len(read()) == 1


# --- Budget(max_seconds) cuts a validator too ---------------------------------------------------


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_max_seconds_cuts_a_validator_still_running_at_the_deadline(rt, kind):
    import asyncio
    release = threading.Event()
    if kind == "sync":
        @incr.validator(version="1")
        def slow(candidate, x):
            release.wait(30)
            yield incr.ACK("late")
    else:
        @incr.validator(version="1")
        async def slow(candidate, x):
            await asyncio.sleep(30)
            return incr.ACK("late")
    s = Script("answer")
    node = make(s, validators=[slow], budget=incr.Budget(max_seconds=0.3))
    try:
        with rt, pytest.raises(incr.NotAccepted) as ei:
            node(0)
    finally:
        release.set()
    assert ei.value.reason == "budget" and "cut at the deadline" in ei.value.report
    assert len(s.calls) == 1


def test_incr_inspect_shows_attempts_unvalidated_and_validator_changes(tmp_path, capsys):
    from incr import cli
    path = str(tmp_path / "s")
    s = Script(incr.Candidate("v1 -a", rationale="first"), incr.Candidate("v2 +a", hypothesis="h2"))
    node = make(s, validators=[cases("a")], version="i")
    plain = make(Script("free text"), version="p")
    rt = incr.Runtime(store=path)
    with rt:
        node(0), plain(0)
    rt.close()
    assert cli.main(["inspect", path]) == 0
    out = capsys.readouterr().out
    assert "revision 1: rejected; rationale first" in out
    assert "revision 2: accepted; hypothesis h2" in out
    assert out.count("node(0)  unvalidated") == 1 and out.count("node(0)  stable") == 1
    assert "Validator changes" not in out      # two definitions, each with its own audit


def test_an_escalation_that_is_accepted_announces_no_stop(rt):
    s = Script("-a")
    node = make(s, validators=[cases("a")], budget=incr.Budget(max_attempts=1),
                on_failure=lambda e: "fixed +a")
    got = collect(rt)
    with rt:
        assert node(0) == "fixed +a"
    kinds = [type(e).__name__ for e in got]
    assert "Stopped" not in kinds and kinds[-1] == "Accepted"


def test_a_pass_budget_bounds_each_stabilization_and_the_next_one_goes_on():
    rt = incr.Runtime(pass_budget=incr.Budget(max_attempts=2), max_workers=1)
    gens = [Script(f"answer {i}") for i in range(3)]
    nodes = [make(g, version=f"p{i}") for i, g in enumerate(gens)]
    obs = [rt.observe(n, 0) for n in nodes]
    with pytest.raises(incr.NotAccepted) as ei:
        rt.stabilize()
    assert ei.value.reason == "budget" and "in this stabilization" in ei.value.report
    assert sum(len(g.calls) for g in gens) == 2
    rt.stabilize()                        # a new stabilization: the third node goes on
    assert [o.value for o in obs] == ["answer 0", "answer 1", "answer 2"]
    assert sum(len(g.calls) for g in gens) == 3
    rt._check()


def test_a_pass_budget_applies_per_astabilize_too():
    import asyncio
    rt = incr.Runtime(pass_budget=incr.Budget(max_attempts=1))
    gens = [Script("a"), Script("b")]
    nodes = [make(g, version=f"q{i}") for i, g in enumerate(gens)]
    obs = [rt.observe(n, 0) for n in nodes]

    async def main():
        with pytest.raises(incr.NotAccepted):
            await rt.astabilize()
        await rt.astabilize()
    asyncio.run(main())
    assert [o.value for o in obs] == ["a", "b"] and sum(len(g.calls) for g in gens) == 2
