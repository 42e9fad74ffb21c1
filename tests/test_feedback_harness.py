"""The feedback benchmark (benchmarks/feedback) in small runs: structural properties only,
never a figure. The simulated model cannot see hidden checks: every model call of a run (its
whole input and its output) is the same with the hidden checks real, replaced, put on every
aspect or poisoned (a read fails the test), and a model made to peek is caught. Equal-spend
curves are exact truncations of a run (checked against really capped runs), the wall-time
curve cuts measured runs at the cap, plain arms make a level's calls at once (a barrier that
needs both), incr_par demands through incr.gather on a threaded runtime, blame is imprecise
and incr climbs through Reject, hidden case names never reach a model, the output says
SIMULATED and records the config and commit, and the real-model path runs end to end over
HTTP."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import Counter

import pytest

from benchmarks.feedback import __main__ as bench
from benchmarks.feedback import arms as A
from benchmarks.feedback.sim import LABEL, SimModel, prompt_for
from benchmarks.feedback.tasks import Check, cause, check_passes, parse, right_value, tasks

CFG, _SHA = bench.load_config()


def _other_hidden(t):
    """The same task with other hidden checks: all dropped but one new one."""
    keep = [c for c in t.checks if c.shown]
    new = [Check("zz_hidden", t.nodes[0].name, t.nodes[0].aspects[-1].name, "hidden")]
    return dataclasses.replace(t, checks=tuple(keep + new))


def _trajectory(arm, t, seed, cfg=CFG):
    ctx = A.Ctx(arm, t, cfg, seed)
    A.execute(ctx)
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


class _Poisoned:
    """A hidden check that can be told apart as hidden (``kind``, ``shown``) and fails the
    test on any other use: its name, node, aspect or where."""
    kind = "hidden"
    shown = False

    def __getattr__(self, name):
        raise AssertionError(f"a loop or the model read a hidden check's {name!r}")


def _poisoned(t):
    return dataclasses.replace(t, checks=tuple(c for c in t.checks if c.shown)
                               + (_Poisoned(),) * len(t.hidden_names))


def _all_hidden(t):
    """The same task with a hidden check on every aspect of every node."""
    keep = [c for c in t.checks if c.shown]
    new = [Check(f"zz_{n.name}_{a.name}_hidden", n.name, a.name, "hidden")
           for n in t.nodes for a in n.aspects]
    return dataclasses.replace(t, checks=tuple(keep + new))


class _Recording:
    """Wraps a run's model: records every call's whole input (prompt, previous, feedback
    with its counterexamples, index) and output."""

    def __init__(self, model):
        self.model, self.calls = model, []
        self.seen_cases = model.seen_cases

    def generate(self, prompt, previous, feedback, k):
        c = self.model.generate(prompt, previous, feedback, k)
        self.calls.append((prompt, previous, tuple((v.case, json.dumps(
            v.counterexample, sort_keys=True)) for v in feedback), k, c.candidate))
        return c


def _calls(arm, t, seed, cfg=CFG, model=None):
    ctx = A.Ctx(arm, t, cfg, seed)
    ctx.model = _Recording(model(ctx) if model else ctx.model)
    A.execute(ctx)
    # threads (incr_par) may order calls of independent nodes differently: compare as a set
    return sorted(ctx.model.calls, key=repr) if arm == "incr_par" else ctx.model.calls


@pytest.mark.parametrize("arm", A.ARMS)
def test_every_model_call_is_the_same_with_hidden_checks_poisoned_or_replaced(arm):
    """The proof that the simulation cannot see hidden checks: every model call of a run --
    its whole input (prompt, previous candidate, feedback and counterexamples) and its output
    -- is the same whether the task's hidden checks are the real ones, replaced by others,
    put on every aspect, or poisoned (any read of one fails the test)."""
    for t in tasks()[::3]:
        for seed in range(2):
            ref = _calls(arm, t, seed)
            assert ref
            for variant in (_poisoned, _other_hidden, _all_hidden):
                assert _calls(arm, variant(t), seed) == ref, (arm, t.id, seed, variant.__name__)


class _Cheat(SimModel):
    """The bug issue 16 reported, on purpose: an edit also sets every aspect a hidden check
    of the node covers to its right value (as a model choosing its fix from all defects,
    hidden ones included, would)."""

    def __init__(self, ctx):
        super().__init__(ctx.cfg, ctx.seed)
        self.task = ctx.task

    def generate(self, prompt, previous, feedback, k):
        c = super().generate(prompt, previous, feedback, k)
        if previous is None or not feedback:
            return c
        d = json.loads(c.candidate)
        for chk in self.task.checks:
            if not chk.shown and chk.node == prompt.node:
                d["own"][chk.aspect] = dict(prompt.request)[chk.aspect]
        c.candidate = json.dumps(d, sort_keys=True, separators=(",", ":"))
        return c


def test_the_proof_catches_a_model_that_reads_hidden_checks():
    """The invariance test above can fail: a model that peeks at the hidden checks is caught
    by the poisoned checks (it raises) and by the replaced ones (its calls change)."""
    t = next(t for t in tasks() if t.id == "chain-4-gap-noprotect")
    caught = changed = 0
    for seed in range(4):
        try:
            _calls("recheck", _poisoned(t), seed, model=_Cheat)
        except AssertionError as e:
            caught += "hidden check" in str(e)
        changed += (_calls("recheck", t, seed, model=_Cheat)
                    != _calls("recheck", _other_hidden(t), seed, model=_Cheat))
    assert caught and changed


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
                                 "incr_norevert", "strong"])
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
    for arm in ("single", "resample", "whole", "cache", "recheck", "incr", "incr_reuse",
                "incr_norevert"):
        ctx = A.Ctx(arm, t, CFG, 3)
        A.execute(ctx)
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


# --- the incr arm without keep-or-revert ------------------------------------------------------


def test_the_norevert_arm_builds_on_the_latest_candidate_and_incr_on_the_best():
    """incr_norevert differs from incr in one thing only: after a regression the engine hands
    the generator its best revision as ``previous``; incr builds on it, incr_norevert on the
    node instance's latest candidate. Where the engine never does that the two arms make the
    same calls."""
    handed = differ = same = 0
    for t in tasks()[::2]:
        for seed in range(3):
            on, off = A.Ctx("incr", t, CFG, seed), A.Ctx("incr_norevert", t, CFG, seed)
            r_on, r_off = A.score(on, A.execute(on)), A.score(off, A.execute(off))
            for node, inst, engine, used, latest in off.previous_log:
                assert used == latest            # never the engine's older revision
                handed += engine != latest
            for node, inst, engine, used, latest in on.previous_log:
                assert used == engine            # the engine's choice, as given
            assert r_off["rebased"] == 0
            assert r_off["engine_rebased"] == sum(1 for x in off.previous_log if x[2] != x[4])
            assert r_on["rebased"] == r_on["engine_rebased"]
            if r_on["rebased"] == 0:
                # keep-or-revert never acted: the same loop, call for call
                assert on.log == off.log
                assert r_on["success"] == r_off["success"]
                same += 1
            else:
                differ += on.log != off.log
    # the engine did hand an older revision, and building on it changed trajectories
    assert handed > 0 and differ > 0 and same > 0


def test_keep_or_revert_summary_pairs_the_two_arms():
    rows_ = bench.run_grid(CFG, [0, 1, 2], ["incr", "incr_norevert"], tasks()[::3])
    k = bench.keep_or_revert(rows_, 50)
    assert k["runs"] == 3 * len(tasks()[::3]) and 0 < k["acted"] < k["runs"]
    assert k["identical_where_not_acted"] == k["not_acted"]
    on = [r for r in rows_ if r["arm"] == "incr"]
    off = [r for r in rows_ if r["arm"] == "incr_norevert"]
    d = k["all"]["success"]
    assert d["diff"] == pytest.approx((sum(r["success"] for r in on)
                                       - sum(r["success"] for r in off)) / len(on))
    # every difference comes from the runs where it acted
    assert k["where_acted"]["success"]["diff"] * k["acted"] == pytest.approx(d["diff"] * k["runs"])
    assert d["ci"][0] <= d["diff"] <= d["ci"][1]


# --- confidence intervals on the per-round figures --------------------------------------------


def test_per_round_rates_have_seed_bootstrap_intervals(rows):
    rs = [r for r in rows if r["arm"] == "incr"]
    pr = bench.per_round(rs, reps=200)
    assert "bootstrap over seeds" in pr["method"]
    for k, a in pr["attempts"].items():
        for name in ("fix", "break", "first_right_break", "gain"):
            v, ci = a[name + "_rate"], a[name + "_ci"]
            if v is not None:
                assert ci is not None and ci[0] <= ci[1]
                # two seeds: the pooled rate lies between the two seeds' own rates
                assert ci[0] - 1e-9 <= v <= ci[1] + 1e-9, (k, name)
    for k, o in pr["outcomes"].items():
        assert o["reverted_ci"] is not None
    # a seed drawn alone reproduces its own rates: the resampling unit is the seed
    one = [r for r in rs if r["seed"] == 0]
    solo = bench.per_round(one, reps=20)
    assert all(v["fix_ci"] is None for v in solo["attempts"].values())   # one seed: no CI
    pooled = bench.per_round(one + one, reps=0)
    for k, a in solo["attempts"].items():
        assert pooled["attempts"][k]["fix_rate"] == a["fix_rate"]


def test_the_gain_rate_is_fixes_minus_breaks_over_retries(rows):
    rs = [r for r in rows if r["arm"] == "recheck"]
    pr = bench.per_round(rs)
    tot = Counter()
    for r in rs:
        for k, wb, fx, rb, br, _fr, _fb in r["per_attempt"]:
            if k == 1:
                tot.update(wb=wb, fx=fx, rb=rb, br=br)
    a = pr["attempts"]["1"]
    assert a["gain_rate"] == pytest.approx((tot["fx"] - tot["br"]) / (tot["wb"] + tot["rb"]))
    assert a["fix_rate"] == pytest.approx(tot["fx"] / tot["wb"])


def test_every_curve_cell_has_an_interval(rows):
    e = bench.equal_spend(rows, "cost", [1.0, 3.0], [2.0], 50)
    assert "bootstrap over seeds" in e["method"]
    for arm, d in e["arms"].items():
        for p in d["curve"]:
            for name in ("spend", "success", "wrong_accepted"):
                lo, hi = p[name + "_ci"]
                assert lo - 1e-9 <= p[name] <= hi + 1e-9, (arm, name)


# --- the real-model path, end to end over real HTTP ---------------------------------------------


class _FakeChat:
    """A local OpenAI-compatible chat-completions server over real HTTP (127.0.0.1, a free
    port), standing in for a model: it answers the value the request asks for, except that a
    first answer (no previous answer in the conversation) gets the first aspect wrong on
    every other prompt; an answer after feedback takes each counterexample's expected value.
    Records every request's path, headers and body."""

    def __init__(self):
        import http.server
        import re
        import threading

        fake = self
        self.requests = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append((self.path, dict(self.headers), body))
                msgs = body["messages"]
                prompt = next(m["content"] for m in msgs if m["role"] == "user")
                want = dict((a, int(v)) for a, v in re.findall(
                    r"(\w+) = (\d+)", prompt.split("The request asks for:")[1].split("\n")[0]))
                prev = [m["content"] for m in msgs if m["role"] == "assistant"]
                if prev:
                    ans = json.loads(prev[-1])
                    for cex in re.findall(r"counterexample: (\{.*\})", msgs[-1]["content"]):
                        c = json.loads(cex)
                        if c.get("aspect") in ans:
                            ans[c["aspect"]] = (c["expected"] if c.get("expected") is not None
                                                else want[c["aspect"]])
                else:
                    ans = dict(want)
                    if len(fake.requests) % 2:
                        first = next(iter(ans))
                        ans[first] = (ans[first] + 1) % 4
                text = json.dumps(ans)
                out = json.dumps({
                    "id": "chatcmpl-fake", "object": "chat.completion", "created": 1700000000,
                    "model": body["model"],
                    "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                                 "message": {"role": "assistant", "content": text}}],
                    "usage": {"prompt_tokens": len(json.dumps(msgs)) // 4,
                              "completion_tokens": len(text) // 4,
                              "total_tokens": len(json.dumps(msgs)) // 4 + len(text) // 4}}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_a_real_model_run_goes_through_the_sdk_over_http(tmp_path, monkeypatch, capsys):
    """``--model openai:NAME --base-url URL``: every arm's model calls go through the openai
    SDK's own HTTP transport to the server; feedback (visible cases only) reaches it; the
    output says REAL, never SIMULATED, and never writes the simulated results."""
    pytest.importorskip("openai", reason="the real-model path needs the openai package")
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
                "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    srv = _FakeChat()
    try:
        out = tmp_path / "real.json"
        picked = ["chain-3", "diamond-3", "codegen-4", "upstream-3"]
        assert bench.main(["--model", "openai:fake-model", "--base-url", srv.url, "--seeds",
                           "1", "--quick", "--tasks", ",".join(picked), "--arms",
                           "single,recheck,incr,incr_norevert", "--out", str(out)]) == 0
    finally:
        srv.close()
    res = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert res["simulated"] is False and "REAL MODEL fake-model" in res["model"]
    assert "SIMULATED" not in res["model"] and "REAL MODEL" in printed
    assert res["real_model"] == {"name": "fake-model", "base_url": srv.url, "temperature": 0.7}
    assert sorted(t["id"] for t in res["tasks"]) == sorted(picked)
    # every model call of every run was one HTTP request to the chat endpoint, with the model
    # name and the temperature; the SDK sent a placeholder key (no key in the environment)
    calls = sum(m["calls"]["mean"] * m["runs"] for m in res["runs"].values())
    assert calls == pytest.approx(len(srv.requests)) and calls > 0
    for path_, headers, body in srv.requests:
        assert path_ == "/v1/chat/completions"
        assert body["model"] == "fake-model" and body["temperature"] == 0.7
        assert {k.lower() for k in headers} >= {"authorization", "user-agent"}
    # feedback went over the wire (an edit: the previous answer, then the NACKs), and no
    # hidden case name ever did
    edits = [b for _p, _h, b in srv.requests if any(m["role"] == "assistant"
                                                     for m in b["messages"])]
    assert edits and any("counterexample" in b["messages"][-1]["content"] for b in edits)
    hidden = {h for t in tasks() if t.id in picked for h in t.hidden_names}
    wire = json.dumps([b for _p, _h, b in srv.requests])
    assert hidden and not any(f'case {h}' in wire or f'"{h}"' in wire for h in hidden)
    # tokens are the server's usage figures
    assert sum(m["tokens"]["mean"] * m["runs"] for m in res["runs"].values()) > 0
    # every call is transcribed: one line per request, with what was sent and the reply
    tr = [json.loads(x) for x in out.with_suffix(".transcripts.jsonl").read_text().splitlines()]
    assert len(tr) == len(srv.requests)
    assert {x["arm"] for x in tr} == {"single", "recheck", "incr", "incr_norevert"}
    assert {x["task"] for x in tr} == set(picked) and {x["seed"] for x in tr} == {0}
    sent = [next(m["content"] for m in b["messages"] if m["role"] == "user")
            for _p, _h, b in srv.requests]
    assert sorted(x["user"] for x in tr) == sorted(sent)
    replies = {x["reply"] for x in tr}
    assert all(r.startswith("{") for r in replies)
    assert any(x["feedback"] and x["previous"] for x in tr)
    assert not any(f["case"] in hidden for x in tr for f in x["feedback"])
    # the fake fixes what feedback names: the loops with feedback beat one pass
    assert res["runs"]["incr"]["success"]["mean"] > res["runs"]["single"]["success"]["mean"]


def test_the_real_model_path_refuses_what_it_cannot_run():
    with pytest.raises(SystemExit):
        bench.main(["--model", "ollama:x", "--quick"])
    with pytest.raises(SystemExit):
        bench.main(["--base-url", "http://127.0.0.1:9/v1", "--quick"])
    with pytest.raises(SystemExit):
        bench.main(["--model", "openai:x", "--base-url", "http://127.0.0.1:9/v1", "--sweep"])
    assert A.REAL_MODEL is None          # the simulation is back for every other run


def test_per_task_means(rows):
    pt = bench.per_task(rows)
    assert set(pt) == {t.id for t in tasks()}
    t = tasks()[-2].id
    rs = [r for r in rows if r["arm"] == "incr_reuse" and r["task"] == t]
    assert pt[t]["incr_reuse"]["calls"] == pytest.approx(sum(r["calls"] for r in rs) / len(rs))
    assert pt[t]["incr_reuse"]["reused_accepted"] == pytest.approx(
        sum(r["reused_accepted"] for r in rs) / len(rs))


# --- concurrency and measured wall time --------------------------------------------------------


def _task(tid):
    return next(t for t in tasks() if t.id == tid)


def test_a_plain_arm_makes_one_levels_calls_at_once_in_the_walltime_run():
    """With workers (the wall-time run), the two nodes sharing the diamond's root make their
    first calls at once: each waits at a barrier that needs both in flight."""
    t = _task("diamond-2")
    for arm in ("whole", "resample", "single"):
        ctx = A.Ctx(arm, t, CFG, 0)
        ctx.workers = 4
        barrier, met = threading.Barrier(2, timeout=20), []

        def hook(node, k, inst):
            if node in ("b1", "b2") and k == 0:
                barrier.wait()
                met.append(node)

        ctx.after_call = hook
        A.execute(ctx)
        assert sorted(met) == ["b1", "b2"] and ctx.peak_in_flight >= 2, arm


def test_level_parallel_plain_arms_make_the_same_calls_as_in_order():
    for arm in ("resample", "whole", "cache", "recheck", "strong"):
        for t in tasks()[::4]:
            a, b = A.Ctx(arm, t, CFG, 1), A.Ctx(arm, t, CFG, 1)
            b.workers = 4
            ra, rb = A.score(a, A.execute(a)), A.score(b, A.execute(b))
            if ra["capped"]:
                continue      # where the meter runs out inside a level, the refused call may differ
            assert sorted(a.log) == sorted(b.log) and ra["success"] == rb["success"], (arm, t.id)


def test_incr_par_demands_through_gather_on_a_threaded_runtime(monkeypatch):
    seen = Counter()
    real_gather, real_runtime = A.incr.gather, A.incr.Runtime

    def gather(*thunks):
        seen["gather"] += 1
        return real_gather(*thunks)

    def runtime(*args, **kw):
        seen[f"max_workers={kw.get('max_workers')}"] += 1
        return real_runtime(*args, **kw)

    monkeypatch.setattr(A.incr, "gather", gather)
    monkeypatch.setattr(A.incr, "Runtime", runtime)
    t = _task("diamond-2")
    r_par = A.run("incr_par", t, CFG, 0)
    assert seen["gather"] > 0 and seen["max_workers=4"] == 1
    seen.clear()
    r = A.run("incr", t, CFG, 0)
    assert seen["gather"] == 0 and seen["max_workers=1"] == 1
    # incr.gather makes the calls of demanding in order: the same run
    assert sorted(r["log"]) == sorted(r_par["log"]) and r["success"] == r_par["success"]


def test_wall_time_is_measured_with_real_sleeps():
    scale = CFG["harness"]["walltime_scale"]
    ts = [_task("chain-3"), _task("diamond-2")]
    rows = bench.walltime_rows(CFG, ["incr", "whole"], [0], ts)
    assert len(rows) == 4
    for r in rows:
        assert r["wall_unit"] == pytest.approx(A.unit_latency(_task(r["task"]), CFG) * scale)
        if r["arm"] == "incr":
            # one thread: its sleeps follow one another, so the measured time holds them all
            assert r["wall_s"] >= r["latency_s"] * scale
            assert r["peak_in_flight"] == 1
    assert any(r["peak_in_flight"] >= 2 for r in rows if r["arm"] == "whole")


def test_the_wall_time_curve_cuts_each_run_at_the_cap():
    rows = [{"arm": "x", "seed": s, "wall_s": w, "wall_unit": 1.0, "capped": False,
             "success": ok, "wrong_accepted": not ok} for s, w, ok in
            ((0, 1.0, True), (0, 3.0, True), (1, 2.0, False), (1, 5.0, True))]
    e = bench.equal_spend(rows, "wall", [0.5, 2.5, 100.0], [2.0], 20, ref="x")
    c = e["arms"]["x"]["curve"]
    assert c[0]["success"] == 0 and c[0]["spend"] == pytest.approx(0.5)
    assert c[1]["success"] == pytest.approx(0.25)            # only the 1 s run finished
    assert c[1]["spend"] == pytest.approx((1.0 + 2.5 + 2.0 + 2.5) / 4)
    assert c[2]["success"] == pytest.approx(0.75) and c[2]["spend"] == pytest.approx(11 / 4)


# --- imprecise blame, climbing through Reject ----------------------------------------------------


def test_blame_is_imprecise_and_incr_climbs_upstream_through_reject():
    """The validator blames the wrong node on the dependency path some of the time; the loop's
    policy climbs; incr raises ``incr.Reject`` at nodes above the checked one and does reach
    a cause at the chain's root (first answer of n1 wrong, run successful)."""
    blamed = Counter()
    rejects_far = reached_root = 0
    for t in [t for t in tasks() if t.family == "chain" and not t.control]:
        for seed in range(12):
            ctx = A.Ctx("incr", t, CFG, seed)
            real_blame = ctx.blame

            far = []

            def blame(chk, current, ctx=ctx, real=real_blame, far=far):
                true = cause(ctx.task, chk, current, ctx.env)
                node, cex = real(chk, current)
                blamed["right" if node == true else "wrong"] += 1
                names = [n.name for n in ctx.task.nodes]
                # in incr every blame of a downstream check is an incr.Reject of that node
                far.append(names.index(chk.node) - names.index(node) >= 2)
                return node, cex

            ctx.blame = blame
            r = A.score(ctx, A.execute(ctx))
            rejects_far += sum(far)
            first_n1 = parse(ctx.firsts[0]["n1"])["own"]["f"]
            reached_root += r["success"] and first_n1 != right_value(t.nodes[0].aspect("f"), 1)
    assert blamed["right"] and blamed["wrong"]
    assert rejects_far and reached_root


def test_in_the_chain_family_the_visible_failure_shows_downstream_of_its_cause():
    for t in [t for t in tasks() if t.family == "chain"]:
        vis_f = {c.node for c in t.visible if c.aspect == "f"}
        assert t.nodes[-1].name in vis_f and t.nodes[0].name not in vis_f, t.id
        assert all(n.embed for n in t.nodes) and all(n.reads for n in t.nodes[1:])


def test_calls_avoided_by_pass_and_by_revalidation_are_counted_for_incr_only():
    got = Counter()
    for t in tasks()[::3]:
        for arm in ("incr", "recheck"):
            r = A.run(arm, t, CFG, 0)
            got[arm, "pass"] += r["passes"]
            got[arm, "reval"] += r["revalidated"]
    assert got["incr", "pass"] > 0 and got["incr", "reval"] > 0
    assert got["recheck", "pass"] == got["recheck", "reval"] == 0


def test_the_page_blocks_are_the_committed_results():
    """docs/evaluation.md's result blocks are what the committed results.json prints (filled
    by ``python -m benchmarks.feedback.page``), and the results come from a clean commit with
    the pre-registered config and the page's task set."""
    from benchmarks.feedback import page

    res = json.loads(page.RESULTS.read_text())
    text = page.PAGE.read_text()
    assert page.BLOCK.findall(text), "the page has no result blocks"
    assert page.render(text, res) == text, "run: python -m benchmarks.feedback.page"
    assert res["config_sha256"] == _SHA and res["deviations"] == []
    assert not res["git_commit"].endswith("+dirty") and res["simulated"] is True
    assert len(res["tasks"]) == len(tasks()) and len(res["arms"]) == len(A.ARMS)
    n_seeds = res["seeds"][1] - res["seeds"][0] + 1
    assert n_seeds == CFG["harness"]["seeds"]
    assert all(m["runs"] == n_seeds * len(tasks()) for m in res["runs"].values())
    for stale in ("ten tasks", "2,000 task runs", "1,600"):
        assert stale not in text


def test_every_preregistered_parameter_is_read_or_refused():
    """A parameter in config.toml that the harness ignored would be a false record: each is
    read somewhere in benchmarks/feedback, and the one with a single implemented value
    refuses any other."""
    import pathlib

    src = "".join(p.read_text() for p in pathlib.Path(bench.HERE).glob("*.py"))
    for sec, vals in CFG.items():
        for key in vals:
            assert f'"{key}"' in src, f"[{sec}] {key} is never read"
    with pytest.raises(SystemExit, match="upstream_change_after_round"):
        bench.load_config(overrides=["harness.upstream_change_after_round=2"])
