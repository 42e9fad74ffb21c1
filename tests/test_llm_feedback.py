"""Feedback from downstream: rt.nack / rt.ack with explicit revisions, incr.Reject inside cells
and validators, regression cases and recheck, effects. The story is MODEL.md's: A interprets a
request, B writes SQL from A's output, C runs it; a NACK on B reopens B only."""

from __future__ import annotations

import pytest

import incr


class Gen:
    """A scripted generator that counts calls and remembers its feedback."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.calls = []

    def __call__(self, *args, previous=None, feedback=()):
        self.calls.append(feedback)
        return self.answers[min(len(self.calls), len(self.answers)) - 1]


@pytest.fixture
def story(rt, log):
    request = rt.input("request", "paid orders, not refunded")
    ga = Gen("paid AND NOT refunded")
    gb = Gen("WHERE paid", "WHERE paid AND NOT refunded", "WHERE paid AND NOT refunded AND 1")

    @incr.llm(version="a1")
    def interpret(r, *, previous=None, feedback=()):
        log("A")
        return ga(request.get(), previous=previous, feedback=feedback)

    @incr.llm(version="b1", budget=incr.Budget(max_attempts=4))
    def write_sql(r, *, previous=None, feedback=()):
        log("B")
        return gb(interpret(r), previous=previous, feedback=feedback)

    @incr.cell
    def run_query(r):
        log("C")
        return f"rows for {write_sql(r)}"

    return request, ga, gb, interpret, write_sql, run_query


def test_nack_current_revision_withdraws_node_and_readers_only(rt, log, story):
    _request, ga, gb, interpret, write_sql, run_query = story
    with rt:
        obs = rt.observe(run_query, "r")
        rt.stabilize()
        # B's generator ran ahead in a thread as far as its read of A (not computed yet); A,
        # the node it stopped at, is brought up to date between rounds, then B runs ahead
        # again and C (the reader) runs once more: B's model (gb) is called once
        assert log.take() == ["C", "B", "A", "C", "B", "C"]
        assert len(gb.calls) == 1
        assert rt.state(write_sql, "r").revision == 1
        rev0 = rt.revision
        rt.nack(write_sql, "r", revision=1, case="refunds",
                counterexample={"rows": [(1, True, True)], "expected": 0, "got": 1})
        assert rt.revision == rev0 + 1
        assert rt.state(write_sql, "r").status == "invalid"     # at once, before any demand
        report = rt.stabilize()
        assert log.take() == ["B", "C"]                          # A is not regenerated
        assert obs.value == "rows for WHERE paid AND NOT refunded"
        assert report.recomputed == ["write_sql('r')", "run_query('r')"]
    assert len(ga.calls) == 1 and len(gb.calls) == 2
    (fb,) = gb.calls[1]
    assert fb.case == "refunds" and fb.counterexample["expected"] == 0
    st = rt.state(write_sql, "r")
    assert st.status == "unvalidated" and st.revision == 2
    assert st.checks[("rt.nack", "", "refunds", 1)].kind == "NACK"


def test_late_verdicts_for_other_revisions_never_move_the_current_status(rt, log, story):
    _request, _ga, gb, _interpret, write_sql, run_query = story
    with rt:
        run_query("r")
        rt.nack(write_sql, "r", revision=1, case="refunds", counterexample="cex1")
        run_query("r")
        log.take()
        assert rt.state(write_sql, "r").revision == 2
        rt.nack(write_sql, "r", revision=1, case="late", counterexample="cex-late")
        rt.ack(write_sql, "r", revision=1, case="late-ack")
        assert rt.state(write_sql, "r").status == "unvalidated"
        assert run_query("r") == "rows for WHERE paid AND NOT refunded"
        assert log.take() == []                                  # nothing withdrawn
    st = rt.state(write_sql, "r")
    assert st.checks[("rt.nack", "", "late", 1)].kind == "NACK"
    assert not any(k[3] == 2 and v.kind == "NACK" for k, v in st.checks.items())
    assert len(gb.calls) == 2


def test_revision_must_exist(rt, story):
    _request, _ga, _gb, _interpret, write_sql, run_query = story
    with rt:
        run_query("r")
    with pytest.raises(ValueError, match="revision"):
        rt.nack(write_sql, "r", revision=7, case="x")
    with pytest.raises(incr.IncrError, match="no candidate"):
        rt.nack(write_sql, "other", revision=1, case="x")


def test_reject_in_a_downstream_cell(rt, log):
    ga = Gen("paid")
    gb = Gen("WHERE paid", "WHERE paid AND NOT refunded")

    @incr.llm(version="a")
    def interpret(r, *, previous=None, feedback=()):
        log("A")
        return ga(r, previous=previous, feedback=feedback)

    @incr.llm(version="b")
    def write_sql(r, *, previous=None, feedback=()):
        log("B")
        return gb(interpret(r), previous=previous, feedback=feedback)

    @incr.cell
    def run_query(r):
        log("C")
        sql = write_sql(r)
        if "refunded" not in sql:
            raise incr.Reject(write_sql, r, case="refunds", counterexample={"got": 2, "expected": 1})
        return f"ran {sql}"

    with rt:
        assert run_query("q") == "ran WHERE paid AND NOT refunded"
    assert log.take() == ["C", "B", "A", "C", "B"]              # aborted C runs again; A once
    st = rt.state(write_sql, "q")
    assert st.revision == 2 and st.status == "unvalidated"
    (key,) = [k for k in st.checks if k[0].startswith("reject")]
    assert key == ("reject:run_query('q')", "", "refunds", 1)   # bound to what C consumed
    assert gb.calls[1][0].counterexample == {"got": 2, "expected": 1}


def test_reject_inside_a_validator_blames_the_upstream_node(rt, log):
    ga = Gen("revenue", "paid revenue")
    gb = Gen("SELECT revenue", "SELECT paid revenue")

    @incr.llm(version="a")
    def interpret(r, *, previous=None, feedback=()):
        log("A")
        return ga(r, previous=previous, feedback=feedback)

    @incr.validator(version="1")
    def sql_ok(candidate, r):
        meaning = interpret(r)
        if "paid" not in meaning:
            raise incr.Reject(interpret, r, case="ambiguous", counterexample="which revenue?")
        if meaning in candidate:
            return incr.ACK("matches")
        return incr.NACK("matches", counterexample=meaning)

    @incr.llm(version="b", validators=[sql_ok])
    def write_sql(r, *, previous=None, feedback=()):
        log("B")
        return gb(interpret(r), previous=previous, feedback=feedback)

    with rt:
        assert write_sql("q") == "SELECT paid revenue"
    assert len(ga.calls) == 2 and ga.calls[1][0].case == "ambiguous"
    assert rt.state(interpret, "q").revision == 2
    # B's candidate was first re-validated under A's new output, failed, and B generated again
    # with its own NACK as feedback; A's counterexample never reaches B
    assert gb.calls[0] == () and [fb.case for fb in gb.calls[1]] == ["matches"]
    assert len(gb.calls) == 2


def test_reject_of_own_node_in_a_validator_is_a_nack(rt):
    g = Gen("a", "ab")

    @incr.validator(version="1")
    def v(candidate, x):
        if "b" not in candidate:
            raise incr.Reject(node, x, case="b", counterexample="needs b")
        return incr.ACK("b")

    @incr.llm(validators=[v])
    def node(x, *, previous=None, feedback=()):
        return g(x, previous=previous, feedback=feedback)

    with rt:
        assert node(0) == "ab"
    assert g.calls[1][0].counterexample == "needs b"


def test_ping_pong_is_bounded_by_the_blamed_nodes_budget(rt):
    g = Gen(*[f"v{i}" for i in range(100)])

    @incr.llm(budget=incr.Budget(max_attempts=3))
    def node(x, *, previous=None, feedback=()):
        return g(x, previous=previous, feedback=feedback)

    @incr.cell
    def never_happy(x):
        v = node(x)
        raise incr.Reject(node, x, case="never", counterexample=v)

    with rt:
        with pytest.raises(incr.NotAccepted) as ei:
            never_happy(0)
    assert ei.value.reason == "budget" and len(g.calls) == 3
    assert rt.state(node, 0).status == "failed"


def test_reject_of_something_that_is_not_a_node_is_a_type_error(rt):
    """A Reject names the LLM node whose candidate is wrong; a plain cell cannot generate again,
    so blaming one is a TypeError (raised where the Reject is made), not a NACK."""
    @incr.cell
    def plain():
        return 1

    @incr.cell
    def bad():
        plain()
        raise incr.Reject(plain, case="x")

    with rt:
        with pytest.raises(TypeError, match="must be the LLM node.*plain cell"):
            bad()
        assert plain() == 1                       # the runtime stays usable


def test_regression_cases_are_fed_back_and_rechecked(rt):
    g = Gen("v1", "v2", "v3 fixed")
    rechecked = []

    def recheck(candidate, counterexample, x):
        rechecked.append((candidate, counterexample))
        if counterexample == "cex-a" and "fixed" not in candidate:
            return incr.NACK("regress-a", counterexample="cex-a")
        return incr.ACK("regress-" + counterexample)

    @incr.llm(recheck=recheck, budget=incr.Budget(max_attempts=5))
    def node(x, *, previous=None, feedback=()):
        return g(x, previous=previous, feedback=feedback)

    with rt:
        assert node(0) == "v1"
        rt.nack(node, 0, revision=1, case="a", counterexample="cex-a")
        assert node(0) == "v3 fixed"
    # v2 was generated with the counterexample, re-checked against it, rejected; v3 passed
    assert [c for c, _ in rechecked] == ["v2", "v3 fixed"]
    assert [fb.case for fb in g.calls[1]] == ["a"]
    assert "a" in [fb.case for fb in g.calls[2]] or "regress-a" in [fb.case for fb in g.calls[2]]
    st = rt.state(node, 0)
    assert st.revision == 3 and st.status == "stable"


def test_late_nack_counterexample_becomes_a_regression_case(rt):
    g = Gen("v1", "v2", "v3")
    rechecked = []

    def recheck(candidate, counterexample, x):
        rechecked.append(candidate)
        return incr.ACK("r")

    @incr.llm(recheck=recheck)
    def node(x, *, previous=None, feedback=()):
        return g(x, previous=previous, feedback=feedback)

    with rt:
        node(0)
        rt.nack(node, 0, revision=1, case="a", counterexample="c1")
        node(0)                                   # v2, rechecked against c1
        rt.nack(node, 0, revision=1, case="b", counterexample="c2")   # late: v2 stays
        assert rt.state(node, 0).status == "stable" and node(0) == "v2"
    assert rechecked == ["v2"]


def test_ack_completes_acceptance_of_the_current_revision_only(rt):
    g = Gen("a", "b")

    @incr.llm(accept=incr.Acceptance(min_cases=1))
    def node(x, *, previous=None, feedback=()):
        return g(x, previous=previous, feedback=feedback)

    with rt:
        with pytest.raises(incr.NotAccepted) as ei:
            node(0)
        assert ei.value.reason == "unknown"
        rt.ack(node, 0, revision=1, case="human-review")
        assert node(0) == "a"
    assert len(g.calls) == 1
    assert rt.state(node, 0).status == "stable"


def test_effect_runs_behind_accepted_candidates_and_again_only_on_change(rt, log):
    g = Gen("draft 1", "draft 2")
    sent = []

    @incr.validator(version="1")
    def polite(candidate, x):
        return incr.ACK("polite")

    @incr.llm(validators=[polite], version="e")
    def email(x, *, previous=None, feedback=()):
        return g(x, previous=previous, feedback=feedback)

    @incr.effect
    def send(x):
        sent.append(email(x))
        return len(sent)

    with rt:
        send(0)
        send(0)
        assert sent == ["draft 1"]
        rt.nack(email, 0, revision=1, case="tone", counterexample="too curt")
        send(0)
    assert sent == ["draft 1", "draft 2"]


def test_effect_does_not_run_on_an_unvalidated_node_even_through_a_cached_cell(rt):
    """An effect runs only once every LLM node it depends on is stable: a node with no
    validators is "unvalidated", so reading it -- directly, or through a plain cell computed
    earlier outside the effect -- fails the effect's run before it gets the value; an ACK
    makes the node stable and the effect then runs once; allow_unvalidated=True opts out."""
    g = Gen("draft", "other")
    sent, also = [], []

    @incr.llm(version="u")
    def email(x, *, previous=None, feedback=()):
        return g(x, previous=previous, feedback=feedback)

    @incr.cell
    def subject(x):
        return email(x).upper()

    @incr.effect
    def send(x):
        sent.append(subject(x))
        return 1

    @incr.effect(allow_unvalidated=True)
    def send_anyway(x):
        also.append(email(x))
        return 1

    with rt:
        assert subject(0) == "DRAFT"                 # computed (and cached) outside the effect
        with pytest.raises(incr.IncrError, match=r"unvalidated.*allow_unvalidated"):
            send(0)
        assert sent == []
        assert rt.state(email, 0).status == "unvalidated"
        rt.ack(email, 0, revision=1, case="human-review")
        assert rt.state(email, 0).status == "stable"
        send(0)
        send(0)
        send_anyway(0)
    assert sent == ["DRAFT"] and also == ["draft"] and len(g.calls) == 1
    with pytest.raises(TypeError, match="allow_unvalidated"):
        incr.effect(allow_unvalidated="yes")


def test_effect_does_not_run_when_its_node_is_not_accepted(rt):
    @incr.validator(version="1")
    def no(candidate, x):
        return incr.NACK("c", counterexample="x")

    @incr.llm(validators=[no], budget=incr.Budget(max_attempts=2))
    def email(x, *, previous=None, feedback=()):
        return "text"

    sent = []

    @incr.effect
    def send(x):
        sent.append(email(x))

    with rt:
        with pytest.raises(incr.NotAccepted):
            send(0)
    assert sent == []


def test_explain_says_why_a_withdrawn_node_ran(rt, story):
    _request, _ga, _gb, _interpret, write_sql, run_query = story
    with rt:
        run_query("r")
        rt.nack(write_sql, "r", revision=1, case="c", counterexample=1)
        run_query("r")
    assert "withdrawn" in rt.explain(write_sql, "r")
    assert "write_sql('r') changed" in rt.explain(run_query, "r")


def test_nack_from_inside_a_cell_is_refused(rt, story):
    _request, _ga, _gb, _interpret, write_sql, _run_query = story

    @incr.cell
    def meddles():
        write_sql("r")
        rt.nack(write_sql, "r", revision=1, case="c")

    with rt:
        with pytest.raises(incr.ReentrancyError):
            meddles()


# -- verdicts incr cannot keep ----------------------------------------------------------------


class NoRepr:
    """A value incr's codec cannot encode and whose repr() fails: nothing can keep it."""

    def __repr__(self):
        raise RuntimeError("no repr")


BAD_OUTSIDE = [
    ("nack", dict(case=object()), "case must be a str"),
    ("nack", dict(case=3), "case must be a str"),
    ("nack", dict(case="\ud800"), "case must be valid text"),
    ("nack", dict(case="c", message=b"bytes"), "message must be a str"),
    ("nack", dict(case="c", counterexample=NoRepr()), "counterexample is"),
    ("ack", dict(case="c", evidence=NoRepr()), "evidence is"),
    ("ack", dict(case=("a", "tuple")), "case must be a str"),
    ("nack", dict(case="c", revision="1"), "revision must be an int"),
    ("nack", dict(case="c", revision=True), "revision must be an int"),
]


@pytest.mark.parametrize("store", [False, True], ids=["memory", "store"])
@pytest.mark.parametrize("kind,kwargs,match", BAD_OUTSIDE,
                         ids=[f"{k}-{m.split()[0]}-{i}" for i, (k, _a, m) in enumerate(BAD_OUTSIDE)])
def test_an_outside_verdict_incr_cannot_keep_is_refused_before_anything_changes(
        tmp_path, store, kind, kwargs, match):
    """rt.nack / rt.ack check every argument first: a clear TypeError naming it, and the node,
    its ledger, rt.revision and the store are as before; later verdicts work; a new process
    reads the node's state (no damaged record) and does not take a NACKed candidate back."""
    import warnings

    path = str(tmp_path / "s") if store else None
    rt = incr.Runtime(store=path)
    gen = Gen("first", "second")

    @incr.llm(version="1")
    def node(k, *, previous=None, feedback=()):
        return gen(k, previous=previous, feedback=feedback)

    with rt:
        assert node(0) == "first"
    before = rt.state(node, 0)
    rev0 = rt.revision
    kwargs = {"revision": 1, **kwargs}
    with pytest.raises(TypeError, match=match):
        getattr(rt, kind)(node, 0, **kwargs)
    after = rt.state(node, 0)
    assert (after.status, after.revision, after.candidate, after.checks) == \
        (before.status, before.revision, before.candidate, before.checks) == \
        ("unvalidated", 1, "first", {})  # no validators (v2)
    assert rt.revision == rev0
    with rt:
        assert node(0) == "first" and len(gen.calls) == 1     # nothing was withdrawn
    rt.nack(node, 0, revision=1, case="wrong", counterexample={"want": "second"})
    with rt:
        assert node(0) == "second"
    assert [f.case for f in gen.calls[1]] == ["wrong"]
    rt._check()
    rt.close()
    if store:
        again = incr.Runtime(store=path)
        with warnings.catch_warnings():
            warnings.simplefilter("error")                       # no DamagedRecordWarning
            s = again.state(node, 0)
            assert s.revision == 2 and s.status == "unvalidated"
            assert s.checks[("rt.nack", "", "wrong", 1)].kind == "NACK"
            with again:
                assert node(0) == "second"
        assert len(gen.calls) == 2
        again.close()


@pytest.mark.parametrize("store", [False, True], ids=["memory", "store"])
def test_a_validator_verdict_incr_cannot_keep_becomes_unknown(tmp_path, store):
    """A validator that yields a verdict incr cannot record (a payload with neither an
    encoding nor a repr) gets UNKNOWN in its place, with a reason naming the problem; one that
    makes a verdict with a bad text field (a case or reason that is not a str: a TypeError where
    the verdict is made) raised, which is UNKNOWN too; its other verdicts count; nothing
    crashes, and the state is stored and read back."""
    import warnings

    path = str(tmp_path / "s") if store else None
    rt = incr.Runtime(store=path)

    @incr.validator(version="1")
    def sloppy(candidate, k):
        yield incr.ACK("fine")
        yield incr.ACK("shown", evidence=NoRepr())
        yield incr.UNKNOWN("why", reason=3)                      # reason: not a str (raises)

    @incr.llm(validators=[sloppy], version="1", budget=incr.Budget(max_attempts=1))
    def node(k, *, previous=None, feedback=()):
        return "cand"

    with rt:
        with pytest.raises(incr.NotAccepted) as e:
            node(0)
    assert e.value.reason == "unknown"                          # UNKNOWN, never NACK or ACK
    checks = rt.state(node, 0).checks
    got = {(k[2], v.kind): getattr(v, "reason", "") for k, v in checks.items()}
    assert set(got) == {("fine", "ACK"), ("*", "UNKNOWN"), ("shown", "UNKNOWN")}
    assert "raised TypeError: incr.UNKNOWN: reason must be a str" in got[("*", "UNKNOWN")]
    assert "unusable ACK: evidence is" in got[("shown", "UNKNOWN")]
    rt._check()
    rt.close()
    if store:
        again = incr.Runtime(store=path)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert again.state(node, 0).status == "failed"
        again.close()


def test_a_reject_incr_cannot_keep_is_a_type_error_where_it_is_raised(rt):
    """incr.Reject checks case, counterexample and message when it is made: inside a cell the
    cell fails with that TypeError; inside a validator it is an UNKNOWN."""
    @incr.llm(version="1")
    def node(k, *, previous=None, feedback=()):
        return "cand"

    @incr.cell
    def reader(k):
        raise incr.Reject(node, k, case=["not", "a", "str"])

    @incr.validator(version="1")
    def rejects(candidate, k):
        raise incr.Reject(node2, k, case="c", counterexample=NoRepr())

    @incr.llm(validators=[rejects], version="1", budget=incr.Budget(max_attempts=1))
    def node2(k, *, previous=None, feedback=()):
        return "cand2"

    with rt:
        node(0)
        with pytest.raises(TypeError, match="incr.Reject: case must be a str"):
            reader(0)
        with pytest.raises(incr.NotAccepted):
            node2(0)
    assert rt.state(node, 0).status == "unvalidated"
    (key, v), = rt.state(node2, 0).checks.items()
    assert v.kind == "UNKNOWN" and "incr.Reject: counterexample is" in v.reason


def test_a_verdict_from_inside_a_computation_is_refused_before_anything_changes(rt, story):
    _request, _ga, _gb, _interpret, write_sql, _run_query = story

    @incr.cell
    def meddles():
        write_sql("r")
        rt.nack(write_sql, "r", revision=1, case="c")

    with rt:
        write_sql("r")
        before = rt.state(write_sql, "r")
        with pytest.raises(incr.ReentrancyError):
            meddles()
    after = rt.state(write_sql, "r")
    assert (after.status, after.checks) == (before.status, before.checks)
    assert after.status == "unvalidated"
