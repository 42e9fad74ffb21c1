"""The feedback benchmark (benchmarks/feedback) in a tiny run: structural properties only,
never a figure. Budgets hold in every arm, hidden checks never reach a loop or the model,
controls are counted, the simulation says it is one, a fixed seed gives the same results,
and the incr arm really runs incr."""

from __future__ import annotations

import json

import pytest

from benchmarks.feedback import __main__ as bench
from benchmarks.feedback import arms as A
from benchmarks.feedback.model import LABEL, SimModel, SimParams
from benchmarks.feedback.tasks import defects, tasks

SEEDS = range(3)


@pytest.fixture(scope="module")
def rows():
    return bench.run_grid(lambda s: SimModel(SimParams(), s), list(SEEDS), A.SCENARIOS,
                          A.ARMS, 0.1)


def test_every_arm_and_scenario_ran_on_every_task(rows):
    ids = {t.id for t in tasks()}
    for sc in A.SCENARIOS:
        for arm in A.ARMS:
            got = {r["task"] for r in rows if r["scenario"] == sc and r["arm"] == arm}
            assert got == ids, (sc, arm)


def test_budgets_are_respected_in_every_arm(rows):
    for r in rows:
        calls, tokens, seconds = r["budget"]
        assert r["calls"] <= calls, r
        # like incr.Budget, tokens and seconds are checked before each call: one call over
        assert r["tokens"] < tokens + 2000 and r["latency_s"] < seconds + 5, r
    single = [r for r in rows if r["arm"] == "single"]
    sizes = {t.id: len(t.nodes) for t in tasks()}
    assert all(r["calls"] == sizes[r["task"]] for r in single)


def test_hidden_checks_never_reach_the_model(rows):
    by_id = {t.id: t for t in tasks()}
    fed_any = False
    for r in rows:
        t = by_id[r["task"]]
        hidden = set().union(*(n.hidden_names for n in t.nodes))
        visible = {c.name for n in t.nodes for c in n.visible}
        fed = set(r["seen_cases"])
        fed_any |= bool(fed)
        assert fed <= visible and not fed & hidden, r["task"]
    assert fed_any, "some feedback was given"


def test_a_loop_cannot_run_a_hidden_check():
    t = next(t for t in tasks() if t.family == "cache")
    ctx = A.Ctx("whole", t, "clean", SimModel(SimParams(), 0), 0)
    node = t.nodes[0]
    hidden = sorted(node.hidden_names)[0]
    with pytest.raises(AssertionError):
        ctx.check(node, hidden, node.space[0])


def test_controls_start_correct_and_are_counted(rows):
    ctrl = [r for r in rows if r["control"] and r["scenario"] != "upstream"]
    assert ctrl and all(r["first_all_correct"] for r in ctrl)   # upstream: scored under env 2
    s = bench.summarize(rows, A.SCENARIOS, A.ARMS, 20)
    for key, m in s.items():
        assert m["controls"] == len(SEEDS) * sum(t.control for t in tasks()), key
        assert 0 <= m["controls_broken"] <= m["controls"]


def test_outcomes_are_consistent(rows):
    for r in rows:
        assert r["success"] + r["wrong_stable"] + r["escalated"] == 1, r
        assert (r["escalation"] is None) == r["accepted"]
        assert r["rounds"] >= 1 and len(r["per_round"]) == A.MAX_TICKS


def test_first_answers_are_the_same_in_every_arm():
    """Common random numbers: round 1 is the same draw for every arm."""
    for t in tasks()[:4]:
        firsts = set()
        for arm in A.ARMS:
            ctx = A.Ctx(arm, t, "clean", SimModel(SimParams(), 7), 7)
            (A.run_incr if arm == "incr" else A.run_plain)(ctx)
            firsts.add(tuple(sorted((n, c) for n, k, c, _e in ctx.gens if k == 0)))
        assert len(firsts) == 1


def test_the_incr_arm_runs_incr():
    t = tasks()[0]
    ctx = A.Ctx("incr", t, "clean", SimModel(SimParams(p_first=0.0), 1), 1)
    out = A.run_incr(ctx)
    # the runtime's own counter of generator calls is the meter's count of model calls
    assert ctx.incr_stats["generations"] == ctx.calls > len(t.nodes)
    assert set(out["final"]) == {n.name for n in t.nodes}


def test_upstream_change_is_scored_under_the_new_input():
    t = next(t for t in tasks() if t.id == "regex-control")
    ctx = A.Ctx("single", t, "upstream", SimModel(SimParams(), 0), 0)
    r = A.score(ctx, A.run_plain(ctx))
    assert ctx.env == 2
    # a control's first order-id regex is right for 6 digits, wrong once 8 are allowed
    node = t.nodes[0]
    first = [c for n, k, c, _e in ctx.gens if n == node.name and k == 0][0]
    assert defects(node, first, 2) and r["wrong_stable"] + r["escalated"] == 1


def test_main_is_reproducible_and_labelled(tmp_path, capsys):
    outs = []
    for i in range(2):
        path = tmp_path / f"r{i}.json"
        assert bench.main(["--quick", "--seeds", "2", "--out", str(path),
                           "--plot", str(tmp_path / "p.svg")]) == 0
        outs.append(json.loads(path.read_text()))
    printed = capsys.readouterr().out
    assert LABEL in printed and "SIMULATED" in outs[0]["model"]
    assert "SIMULATED" in (tmp_path / "p.svg").read_text()
    assert outs[0]["summary"] == outs[1]["summary"]
    assert outs[0]["simulated"] is True and outs[0]["params"]["p_first"] == 0.5
