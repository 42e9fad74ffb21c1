"""LLM nodes: generation under validator evidence, the verdict ledger, acceptance, PASS path,
stop conditions. Every test counts generator and validator calls, not only values."""

from __future__ import annotations

import time

import pytest

import incr


class Script:
    """A scripted generator: returns answers in order (the last one repeats), and records
    every call's ``previous`` and ``feedback``."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.calls = []

    def __call__(self, *args, previous=None, feedback=()):
        self.calls.append({"args": args, "previous": previous, "feedback": feedback})
        i = min(len(self.calls), len(self.answers)) - 1
        a = self.answers[i]
        if isinstance(a, BaseException):
            raise a
        return a


def make(script, **kw):
    @incr.llm(**kw)
    def node(x, *, previous=None, feedback=()):
        return script(x, previous=previous, feedback=feedback)
    return node


def contains(word, *, version="1", case=None, log=None):
    @incr.validator(version=version)
    def check(candidate, x):
        if log is not None:
            log.append(candidate)
        c = case or f"has_{word}"
        if word in candidate:
            return incr.ACK(c)
        return incr.NACK(c, counterexample={"missing": word}, message=f"say {word}")
    return check


def test_no_validators_accepts_first_candidate_then_pass(rt):
    s = Script("a", "b")
    node = make(s)
    with rt:
        assert node(1) == "a"
        assert node(1) == "a"
    assert len(s.calls) == 1
    st = rt.state(node, 1)
    assert (st.status, st.revision, st.candidate) == ("unvalidated", 1, "a")  # v2: nothing checked it
    assert rt.stats()["generations"] == 1


def test_nack_feeds_counterexample_back_and_accepts(rt):
    s = Script("select paid", "select paid not refund")
    seen = []
    node = make(s, validators=[contains("refund", log=seen)], budget=incr.Budget(max_attempts=3))
    with rt:
        assert node("q") == "select paid not refund"
    assert len(s.calls) == 2
    assert s.calls[0]["previous"] is None and s.calls[0]["feedback"] == ()
    assert s.calls[1]["previous"] == "select paid"
    (fb,) = s.calls[1]["feedback"]
    assert fb.kind == "NACK" and fb.case == "has_refund" and fb.counterexample == {"missing": "refund"}
    assert seen == ["select paid", "select paid not refund"]
    st = rt.state(node, "q")
    assert st.status == "stable" and st.revision == 2
    vid = f"{contains.__module__}.contains.<locals>.check"
    assert st.checks[(vid, "1", "has_refund", 1)].kind == "NACK"
    assert st.checks[(vid, "1", "has_refund", 2)].kind == "ACK"
    assert len(st.context_key) == 34 and int(st.context_key, 16) >= 0
    assert rt.stats()["generations"] == 2 and rt.stats()["validations"] == 2


def test_min_cases_and_duplicates_count_once(rt):
    @incr.validator(version="1")
    def same_twice(candidate, x):
        yield incr.ACK("one")
        yield incr.ACK("one")          # the same evidence again: counts once

    s = Script("a", "b", "c")
    node = make(s, validators=[same_twice], accept=incr.Acceptance(min_cases=2))
    with rt:
        with pytest.raises(incr.NotAccepted) as ei:
            node(0)
    assert ei.value.reason == "unknown"       # nothing to learn from: no NACK, too few cases
    assert len(s.calls) == 1
    assert ei.value.best == "a"
    assert rt.state(node, 0).status == "failed"


def test_two_distinct_cases_meet_min_cases(rt):
    @incr.validator(version="1")
    def two(candidate, x):
        yield incr.ACK("one")
        yield incr.ACK("two")

    s = Script("a")
    node = make(s, validators=[two], accept=incr.Acceptance(min_cases=2))
    with rt:
        assert node(0) == "a"


def test_validator_exception_and_timeout_are_unknown_never_nack(rt):
    @incr.validator(version="1")
    def crashes(candidate, x):
        raise RuntimeError("database down")

    @incr.validator(version="1", timeout=0.05)
    def slow(candidate, x):
        time.sleep(1.0)
        return incr.ACK("late")

    for v in (crashes, slow):
        s = Script("a", "b")
        node = make(s, validators=[v])
        with rt:
            with pytest.raises(incr.NotAccepted) as ei:
                node(v.__name__)
        assert ei.value.reason == "unknown"
        assert len(s.calls) == 1               # UNKNOWN is not feedback: no blind regeneration
        st = rt.state(node, v.__name__)
        kinds = {c.kind for c in st.checks.values()}
        assert kinds == {"UNKNOWN"}
        assert not any(line.strip().startswith("NACK") for line in ei.value.report.splitlines())
        assert "UNKNOWN" in ei.value.report


def test_unknown_from_optional_validator_does_not_block(rt):
    @incr.validator(version="1")
    def crashes(candidate, x):
        raise RuntimeError("flaky")

    req = contains("a")
    node = make(Script("a"), validators=[req, crashes], accept=incr.Acceptance(required=[req]))
    with rt:
        assert node(0) == "a"


def test_required_must_be_a_validator_of_the_node():
    other = contains("x")
    with pytest.raises(ValueError, match="required validator"):
        make(Script("a"), validators=[contains("a")], accept=incr.Acceptance(required=[other]))


def test_budget_bounds_generator_calls(rt):
    s = Script("x1", "x2", "x3", "x4", "x5", "x6")
    node = make(s, validators=[contains("never")], budget=incr.Budget(max_attempts=3))
    # each candidate fails with a new counterexample: progress, so only the budget stops it

    @incr.validator(version="1")
    def new_cex(candidate, x):
        return incr.NACK("c", counterexample=candidate)

    node = make(s, validators=[new_cex], budget=incr.Budget(max_attempts=3))
    with rt:
        with pytest.raises(incr.NotAccepted) as ei:
            node(0)
    assert ei.value.reason == "budget" and len(s.calls) == 3 and ei.value.attempts == 3
    assert "x1" in ei.value.report and "counterexample" in ei.value.report


def test_token_and_cost_budgets(rt):
    calls = []

    @incr.validator(version="1")
    def new_cex(candidate, x):
        return incr.NACK("c", counterexample=candidate)

    @incr.llm(validators=[new_cex], budget=incr.Budget(max_attempts=10, max_tokens=250))
    def node(x, *, previous=None, feedback=()):
        calls.append(1)
        return incr.Candidate(f"v{len(calls)}", tokens=100, cost=0.5)

    with rt:
        with pytest.raises(incr.NotAccepted) as ei:
            node(0)
    assert ei.value.reason == "budget" and len(calls) == 3   # 300 tokens >= 250 after 3


def test_oscillation_stops_when_a_candidate_comes_back(rt):
    s = Script("a", "b", "a", "b")

    @incr.validator(version="1")
    def never(candidate, x):
        return incr.NACK("c", counterexample=f"no {candidate}")

    node = make(s, validators=[never], budget=incr.Budget(max_attempts=10))
    with rt:
        with pytest.raises(incr.NotAccepted) as ei:
            node(0)
    assert ei.value.reason == "oscillation" and len(s.calls) == 3


def test_no_progress_after_two_attempts_without_new_evidence(rt):
    s = Script("a", "b", "c", "d", "e")
    node = make(s, validators=[contains("zzz")], budget=incr.Budget(max_attempts=10))
    with rt:
        with pytest.raises(incr.NotAccepted) as ei:
            node(0)
    # attempt 1 brings the NACK; attempts 2 and 3 bring the same NACK again: stop
    assert ei.value.reason == "no_progress" and len(s.calls) == 3


def test_validator_instability(rt):
    @incr.validator(version="1")
    def contradicts(candidate, x):
        yield incr.ACK("c")
        yield incr.NACK("c", counterexample=1)

    s = Script("a", "b")
    node = make(s, validators=[contradicts])
    with rt:
        with pytest.raises(incr.NotAccepted) as ei:
            node(0)
    assert ei.value.reason == "validator_unstable" and len(s.calls) == 1


def test_failed_node_demanded_again_calls_nothing_until_something_changes(rt):
    x = rt.input("x", "zzz-less")
    s = Script("a", "b", "c", "d")

    @incr.validator(version="1")
    def wants(candidate, arg):
        need = x.get()
        return incr.ACK("w") if need in candidate else incr.NACK("w", counterexample=need)

    node = make(s, validators=[wants], budget=incr.Budget(max_attempts=2))
    with rt:
        with pytest.raises(incr.NotAccepted):
            node(0)
        n = len(s.calls)
        with pytest.raises(incr.NotAccepted) as ei:
            node(0)
        assert len(s.calls) == n and ei.value.reason == "budget"
        x.set("c")                              # new context: a fresh budget
        assert node(0) == "c"
    assert len(s.calls) == n + 1


def test_dependency_change_revalidates_before_generating(rt, log):
    want = rt.input("want", "a")
    s = Script("a b", "c")

    @incr.validator(version="1")
    def has(candidate, x):
        log("validate")
        w = want.get()
        return incr.ACK(w) if w in candidate else incr.NACK(w, counterexample=w)

    node = make(s, validators=[has])

    @incr.cell
    def reader():
        log("reader")
        return node(0).upper()

    with rt:
        assert reader() == "A B"
        assert log.take() == ["reader", "validate"]
        want.set("b")                           # still satisfied: no generation, cutoff
        assert reader() == "A B"
        assert log.take() == ["validate"]
        assert len(s.calls) == 1
        want.set("c")                           # now it fails: generate
        assert reader() == "C"
        assert log.take() == ["validate", "validate", "reader"]
    assert len(s.calls) == 2
    st = rt.state(node, 0)
    assert st.revision == 2 and st.dependency_revisions == {"input 'want'": 2}


def test_generator_dependencies_are_kept_on_the_revalidation_path(rt):
    schema = rt.input("schema", "v1")
    other = rt.input("other", 0)
    calls = []

    @incr.validator(version="1")
    def ok(candidate, x):
        other.get()
        return incr.ACK("ok")

    @incr.llm(validators=[ok])
    def node(x, *, previous=None, feedback=()):
        calls.append(1)
        return f"sql for {schema.get()}"

    with rt:
        assert node(0) == "sql for v1"
        other.set(1)                            # re-validation only
        assert node(0) == "sql for v1" and len(calls) == 1
        schema.set("v2")                        # still read by the node: the context changed
        # re-validation passes on the old text (the validator cannot see the schema) ...
        assert node(0) == "sql for v1"
    assert len(calls) == 1
    assert "input 'schema'" in rt.state(node, 0).dependency_revisions


def test_transport_errors_are_retried_and_never_fed_back(rt):
    class RateLimitError(Exception):
        pass

    s = Script(RateLimitError("slow down"), ConnectionError("reset"), "ok")
    node = make(s, budget=incr.Budget(max_attempts=5))
    node.backoff = 0.001
    with rt:
        assert node(0) == "ok"
    assert len(s.calls) == 3
    assert all(c["feedback"] == () for c in s.calls)
    assert rt.state(node, 0).revision == 1


def test_transport_retries_count_against_the_budget(rt):
    s = Script(ConnectionError("down"))
    node = make(s, budget=incr.Budget(max_attempts=2))
    node.backoff = 0.001
    with rt:
        with pytest.raises(incr.NotAccepted) as ei:
            node(0)
    assert ei.value.reason == "budget" and len(s.calls) == 2


def test_other_generator_errors_propagate_unchanged(rt):
    s = Script(KeyError("bug"), "ok")
    node = make(s)
    with rt:
        with pytest.raises(KeyError):
            node(0)
        assert node(0) == "ok"                  # nothing kept: it runs again


@pytest.mark.parametrize("stored", [False, True])
def test_a_generator_error_in_a_new_context_never_falls_back_to_the_old_candidate(
        stored, tmp_path):
    """A node with nothing to validate with must generate in a new context. When that call
    raises, the next demand generates again (it used to return the old context's candidate,
    the run having taken the change in); with a store, a new process does the same."""
    calls = []

    def build(rt):
        topic = rt.input("topic", "t0")

        @incr.llm(version="1")
        def summary(i, *, previous=None, feedback=()):
            calls.append(topic.get())
            if calls == ["t0", "t1"]:
                raise KeyError("bug")
            return f"{topic.get()}-{i}"
        return topic, summary

    rt = incr.Runtime(store=tmp_path / "s" if stored else None)
    topic, summary = build(rt)
    with rt:
        assert summary(0) == "t0-0"
        topic.set("t1")
        with pytest.raises(KeyError):
            summary(0)
        rt._check()
        if not stored:
            assert summary(0) == "t1-0"
    if stored:
        rt.close()
        rt = incr.Runtime(store=tmp_path / "s")
        topic, summary = build(rt)
        topic.set("t1")
        with rt:
            assert summary(0) == "t1-0"
    assert calls == ["t0", "t1", "t1"]
    rt._check()
    rt.close()


def test_generator_must_take_previous_and_feedback():
    with pytest.raises(TypeError, match="previous= and feedback="):
        @incr.llm
        def bad(x):
            return x


def test_bad_budget_and_acceptance():
    with pytest.raises(ValueError, match="max_attempts"):
        incr.Budget(max_attempts=0)
    with pytest.raises(ValueError, match="min_cases"):
        incr.Acceptance(min_cases=-1)
    with pytest.raises(TypeError, match="validators must be made with"):
        make(Script("a"), validators=[lambda c: None])


def test_state_of_a_node_never_run(rt):
    node = make(Script("a"))
    with pytest.raises(incr.IncrError, match="never run"):
        rt.state(node, 0)
    with pytest.raises(TypeError, match="@incr.llm"):
        rt.state(lambda: 1)
