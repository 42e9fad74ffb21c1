"""The feedback benchmark (benchmarks/feedback) in small runs: structural properties only,
never a figure. The simulated model cannot see hidden checks (whole trajectories do not move
when the hidden checks change), equal-spend curves are exact truncations of a run (checked
against really capped runs), hidden case names never reach a model, the output says
SIMULATED and records the config and commit."""

from __future__ import annotations

import dataclasses
import json

import pytest

from benchmarks.feedback import __main__ as bench
from benchmarks.feedback import arms as A
from benchmarks.feedback.sim import LABEL, SimModel, prompt_for
from benchmarks.feedback.tasks import Check, check_passes, tasks

CFG, _SHA = bench.load_config()


def _other_hidden(t):
    """The same task with other hidden checks: all dropped but one new one."""
    keep = [c for c in t.checks if c.shown]
    new = [Check("zz_hidden", t.nodes[0].name, t.nodes[0].aspects[-1].name, "hidden")]
    return dataclasses.replace(t, checks=tuple(keep + new))


def _trajectory(arm, t, seed):
    ctx = A.Ctx(arm, t, CFG, seed)
    if arm == "incr":
        A.run_incr(ctx, 1)
    else:
        A.run_plain(ctx)
    return [(n, k) for n, k, _c, _t in ctx.log], dict(ctx.cur), ctx.calls, ctx.cost


@pytest.mark.parametrize("arm", [a for a in A.ARMS if a != "incr_par"])
def test_the_simulation_and_the_loops_never_read_hidden_checks(arm):
    changed = 0
    for t in tasks()[::2]:
        t2 = _other_hidden(t)
        assert t2.hidden_names != t.hidden_names
        for seed in range(3):
            assert _trajectory(arm, t, seed) == _trajectory(arm, t2, seed), (arm, t.id, seed)
            r1, r2 = A.run(arm, t, CFG, seed), A.run(arm, t2, CFG, seed)
            changed += r1["success"] != r2["success"]
    # the hidden checks do matter for the score (the invariance above is not vacuous)
    assert changed > 0 or arm == "strong"


def test_the_prompt_is_the_same_whatever_the_checks():
    for t in tasks():
        t2 = _other_hidden(t)
        for n in t.nodes:
            assert prompt_for(t, n.name, 1, {}) == prompt_for(t2, n.name, 1, {})
            m1, m2 = SimModel(CFG, 5), SimModel(CFG, 5)
            p = prompt_for(t, n.name, 2, {})
            for k in range(6):
                assert m1.generate(p, None, (), k).candidate == m2.generate(
                    prompt_for(t2, n.name, 2, {}), None, (), k).candidate


def test_asking_again_without_feedback_resamples():
    t = tasks()[1]
    m = SimModel(CFG, 0)
    p = prompt_for(t, t.nodes[0].name, 1, {})
    first = m.generate(p, None, (), 0).candidate
    again = {m.generate(p, first, (), k).candidate for k in range(1, 30)}
    assert first not in again and len(again) > 1


@pytest.mark.parametrize("arm", ["resample", "whole", "cache", "recheck", "incr", "strong"])
def test_equal_spend_curves_are_exact_truncations(arm):
    """What the curve says an arm does under cap m is what the arm does when really capped."""
    checked = 0
    for t in tasks()[::4]:
        for seed in range(2):
            full = A.run(arm, t, CFG, seed)
            for m in (1.0, 2.0, 3.0):
                capped = A.run(arm, t, CFG, seed, cap_multiple=m)
                done, spend = bench.truncate(full, "cost", m)
                assert capped["success"] == (done and full["success"]), (t.id, seed, m)
                assert capped["cost"] / capped["unit"] == pytest.approx(spend), (t.id, seed, m)
                if done:
                    assert capped["calls"] == full["calls"]
                    checked += 1
                else:
                    assert capped["reason"] == "budget" and capped["cost"] >= m * capped["unit"]
    assert checked


def test_curve_accounting_sums_the_runs():
    rows = bench.run_grid(CFG, [0, 1], ["single", "recheck"], tasks()[:6])
    ps = bench.per_seed_curves(rows, "cost", [1.0, 100.0])
    for arm in ("single", "recheck"):
        pts = bench.curve(ps[arm], [0, 1])
        rs = [r for r in rows if r["arm"] == arm]
        # with a cap nobody reaches, the curve is the plain mean of the runs
        assert pts[1][0] == pytest.approx(sum(r["cost"] / r["unit"] for r in rs) / len(rs))
        assert pts[1][1] == pytest.approx(sum(r["success"] for r in rs) / len(rs))
    single = bench.curve(ps["single"], [0, 1])
    assert single[0][0] == pytest.approx(1.0)   # one first call per node is the unit
    assert bench.interpolate([(1.0, 0.2, 0), (3.0, 0.6, 0)], 2.0) == pytest.approx(0.4)
    assert bench.interpolate([(1.0, 0.2, 0), (3.0, 0.6, 0)], 9.0) == pytest.approx(0.6)
    assert bench.interpolate([(1.0, 0.2, 0), (3.0, 0.6, 0)], 0.5) is None


@pytest.fixture(scope="module")
def rows():
    return bench.run_grid(CFG, [0, 1], list(A.ARMS))


def test_hidden_case_names_never_reach_the_model(rows):
    by_id = {t.id: t for t in tasks()}
    fed_any = False
    for r in rows:
        t = by_id[r["task"]]
        fed = set(r["seen_cases"])
        fed_any |= bool(fed)
        assert not fed & t.hidden_names, (r["arm"], r["task"])
    assert fed_any


def test_a_loop_cannot_run_a_hidden_check():
    t = tasks()[0]
    ctx = A.Ctx("recheck", t, CFG, 0)
    hidden = next(c for c in t.checks if not c.shown)
    with pytest.raises(AssertionError):
        ctx.run_check(hidden, {})


def test_outcomes_are_consistent_and_controls_start_right(rows):
    for r in rows:
        assert r["success"] + r["wrong_accepted"] + r["escalated"] == 1, r
        assert (r["reason"] is None) == r["accepted"]
        if r["control"] and r["family"] != "upstream":
            assert r["first_all_correct"]
    single = [r for r in rows if r["arm"] == "single"]
    assert all(r["calls"] == r["nodes"] for r in single)


def test_first_answers_are_the_same_in_every_base_arm():
    t = tasks()[2]
    firsts = set()
    for arm in ("single", "resample", "whole", "cache", "recheck", "incr"):
        ctx = A.Ctx(arm, t, CFG, 3)
        A.run_incr(ctx) if arm == "incr" else A.run_plain(ctx)
        firsts.add(tuple(sorted((n, A.parse(c)["own"].__repr__()) for n, c in ctx.first.items())))
    assert len(firsts) == 1


def test_the_incr_arms_run_incr_with_threads():
    t = next(t for t in tasks() if t.family == "diamond")
    for seed in range(3):
        a, b = A.Ctx("incr", t, CFG, seed), A.Ctx("incr_par", t, CFG, seed)
        A.run_incr(a, 1)
        A.run_incr(b, 4)
        # the runtime's count of generator calls is the meter's count of model calls (plus
        # the one call the meter refused, when the budget ran out)
        for c in (a, b):
            assert c.incr_stats["generations"] == c.calls + c.capped >= len(t.nodes)


def test_task_set_is_what_the_page_says():
    ts = tasks()
    assert len(ts) >= 20 and len({t.family for t in ts}) == 4
    assert all(3 <= len(t.nodes) <= 5 for t in ts)
    assert sum(t.control for t in ts) == 4
    assert all(any(c.kind == "hidden" for c in t.checks) for t in ts)
    assert sum(any(c.kind == "protective" for c in t.checks) for t in ts) >= 20
    for t in ts:
        fam_ok = any(n.reads for n in t.nodes)
        assert fam_ok   # every task has an LLM node reading another


def test_main_is_reproducible_and_labelled(tmp_path, capsys):
    outs = []
    for i in range(2):
        path = tmp_path / f"r{i}.json"
        assert bench.main(["--quick", "--seeds", "2", "--arms", "single,recheck,incr",
                           "--out", str(path), "--plot", str(tmp_path / "p.svg")]) == 0
        outs.append(json.loads(path.read_text()))
    printed = capsys.readouterr().out
    assert LABEL in printed and "SIMULATED" in outs[0]["model"]
    assert "SIMULATED" in (tmp_path / "p.svg").read_text()
    assert outs[0]["runs"] == outs[1]["runs"]
    assert outs[0]["config_sha256"] == _SHA and outs[0]["git_commit"]
    assert outs[0]["deviations"] == []
