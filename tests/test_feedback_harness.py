"""The feedback benchmark (benchmarks/feedback) in small runs: structural properties only,
never a figure. The simulated model cannot see hidden checks (whole trajectories do not move
when the hidden checks change), equal-spend curves are exact truncations of a run (checked
against really capped runs), hidden case names never reach a model, the output says
SIMULATED and records the config and commit."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

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


def _trajectory(arm, t, seed, cfg=CFG):
    ctx = A.Ctx(arm, t, cfg, seed)
    if arm in ("incr", "incr_reuse"):
        A.run_incr(ctx, 1, reuse=arm == "incr_reuse")
    else:
        A.run_plain(ctx)
    return ([(x[0], x[1], x[4]) for x in ctx.log], {i: dict(c) for i, c in ctx.curs.items()},
            ctx.calls, ctx.cost)


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


@pytest.mark.parametrize("arm", ["resample", "whole", "cache", "recheck", "incr", "incr_reuse",
                                 "strong"])
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
    for arm in ("single", "resample", "whole", "cache", "recheck", "incr", "incr_reuse"):
        ctx = A.Ctx(arm, t, CFG, 3)
        A.run_incr(ctx, reuse=arm == "incr_reuse") if "incr" in arm else A.run_plain(ctx)
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
    assert len(ts) == 30 and len({t.family for t in ts}) == 5
    assert all(3 <= len(t.nodes) <= 5 for t in ts)
    assert sum(t.control for t in ts) == 5
    multi = [t for t in ts if t.instances > 1]
    assert len(multi) == 6 and {t.family for t in multi} == {"instances"}
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


# --- incr with reuse-by-revalidation, per-round metrics, flaky validators -------------------


def _instances(vary: bool):
    return [t for t in tasks() if t.instances > 1 and not t.control
            and any(a.per_instance for n in t.nodes for a in n.aspects) == vary]


def test_reuse_makes_fewer_model_calls_where_instances_share_the_answer():
    plain = reuse = avoided = 0
    for t in _instances(vary=False):
        for seed in range(4):
            a, b = A.run("incr", t, CFG, seed), A.run("incr_reuse", t, CFG, seed)
            plain += a["calls"]
            reuse += b["calls"]
            avoided += b["reused_accepted"]
            assert a["reused"] == 0 and b["reused"] >= b["reused_accepted"]
    assert avoided > 0 and reuse < plain
    # single-instance tasks: nothing to reuse, the reuse arm is the incr arm, call for call
    for t in tasks()[:24:5]:
        assert _trajectory("incr", t, 1) == _trajectory("incr_reuse", t, 1)


def test_reuse_never_accepts_without_evidence_on_its_own_instance():
    rejected_reuse = 0
    for t in _instances(vary=True) + _instances(vary=False):
        for seed in range(4):
            ctx = A.Ctx("incr_reuse", t, CFG, seed)
            out = A.run_incr(ctx, 1, reuse=True)
            r = A.score(ctx, out)
            # every acceptance (reused candidates included) had an ACK for that very revision
            # under its own label (instance), seen through rt.on_event
            assert ctx.events.get("Accepted", 0) > 0 and r["reuse_unbacked"] == 0
            # an accepted run passes the visible checks of every instance, its own evidence
            assert not r["accepted"] or r["visible_ok"], (t.id, seed)
            rejected_reuse += sum(1 for _n, _i, _x, o, reused in ctx.attempts
                                  if reused and o != "accepted")
    # where instances differ, re-validation does turn reused candidates down
    assert rejected_reuse > 0


def test_per_attempt_metrics_add_up_and_match_the_engine_records():
    t_all = tasks()[::3]
    for arm in ("recheck", "incr"):
        for t in t_all:
            for seed in range(2):
                ctx = A.Ctx(arm, t, CFG, seed)
                out = A.run_incr(ctx, 1) if arm == "incr" else A.run_plain(ctx)
                r = A.score(ctx, out)
                firsts = {(x[0], x[4]) for x in ctx.log}
                n = sum(k[1] + k[3] for k in r["per_attempt"])
                assert n == r["calls"] - len(firsts), (arm, t.id, seed)   # every retry, once
                for k, wb, fixed, rb, broken, fr, fbroken in r["per_attempt"]:
                    assert k >= 1 and 0 <= fixed <= wb and 0 <= broken <= rb
                    assert 0 <= fbroken <= fr <= rb
                if arm == "incr":
                    oc = Counter()
                    for v in r["outcomes_by_attempt"].values():
                        oc.update(v)
                    assert sum(oc.values()) == len(ctx.attempts)
                    # the attempt records and the typed events tell the same story
                    assert oc["reverted"] == r["events"].get("Reverted", 0) == r["reverts"]
                    assert oc["stopped"] == r["events"].get("Stopped", 0)
                    if not r["capped"]:      # (the harness's meter cuts without a Stopped)
                        assert r["escalated"] == (oc["stopped"] > 0)
                    assert oc["accepted"] <= r["events"].get("Accepted", 0)


def test_per_round_summary_rates(rows):
    pr = bench.per_round([r for r in rows if r["arm"] == "incr"])
    assert pr["attempts"] and pr["outcomes"] and pr["escalation_by_round"]
    for k, a in pr["attempts"].items():
        assert a["fix_rate"] is None or 0 <= a["fix_rate"] <= 1
    for k, o in pr["outcomes"].items():
        assert abs(sum(o[x] for x in ("accepted", "rejected", "reverted", "stopped",
                                      "interrupted")) - 1) < 1e-9
    single = bench.per_round([r for r in rows if r["arm"] == "single"])
    assert single["attempts"] == {}        # one call per node: no retries to rate


def test_flaky_validators_flip_verdicts_and_stay_blind_to_hidden_checks():
    flaky, _ = bench.load_config(overrides=["validator.p_flaky=0.3"])
    flips = wrong = 0
    for t in tasks()[::4]:
        for seed in range(2):
            assert A.run("recheck", t, CFG, seed)["flips"] == 0
            r = A.run("incr", t, flaky, seed)
            flips += r["flips"]
            wrong += r["wrong_accepted"]
    assert flips > 0 and wrong > 0
    for arm in ("recheck", "incr"):
        for t in tasks()[1::6]:
            assert _trajectory(arm, t, 0, flaky) == _trajectory(arm, _other_hidden(t), 0, flaky)
    rows_ = bench.run_grid(CFG, [0, 1], ["single", "incr"], tasks()[:4])
    out = bench.flaky(CFG, ["single", "incr"], [0, 1], rows_, 20)
    assert out["p_flaky"] == CFG["harness"]["flaky_p"] > 0
    assert out["arms"]["incr"]["clean_success"]["mean"] == pytest.approx(
        sum(r["success"] for r in rows_ if r["arm"] == "incr") / 8)


def test_the_incr_arms_use_the_preregistered_patience():
    assert CFG["incr"]["patience"] == 2
    tight, _ = bench.load_config(overrides=["incr.patience=1"])
    loose, _ = bench.load_config(overrides=["incr.patience=50"])
    reasons = Counter()
    for t in tasks()[::2]:
        for seed in range(3):
            reasons["tight:" + str(A.run("incr", t, tight, seed)["reason"])] += 1
            reasons["loose:" + str(A.run("incr", t, loose, seed)["reason"])] += 1
    assert reasons["tight:divergence"] > reasons["loose:divergence"] == 0
