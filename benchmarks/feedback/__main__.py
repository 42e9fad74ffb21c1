"""``python -m benchmarks.feedback``: run the arms, print the tables, write JSON and the plot.

Every figure is from a SIMULATED model (benchmarks/feedback/sim.py) with the pre-registered
parameters of benchmarks/feedback/config.toml. Nothing here asserts a figure.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import subprocess
import sys
import time
import tomllib
from collections import Counter, defaultdict
from pathlib import Path

from benchmarks.feedback import arms as A
from benchmarks.feedback.sim import LABEL
from benchmarks.feedback.tasks import tasks

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CONFIG = HERE / "config.toml"
UNITS = ("cost", "calls", "tokens")


def load_config(path=CONFIG, overrides=()):
    raw = Path(path).read_bytes()
    cfg = tomllib.loads(raw.decode())
    for item in overrides:
        key, _, val = item.partition("=")
        sec, _, name = key.partition(".")
        if sec not in cfg or name not in cfg[sec]:
            raise SystemExit(f"--set {item}: no such parameter")
        cfg[sec][name] = type(cfg[sec][name])(json.loads(val))
    if cfg["harness"].get("upstream_change_after_round", 1) != 1:
        # every arm changes the request after its first round (plain loops: after the first
        # evaluation; incr: after a pass holding every node to its first answer); another
        # round is not implemented, and a value the harness ignored would be a false record
        raise SystemExit(f"harness.upstream_change_after_round = "
                         f"{cfg['harness']['upstream_change_after_round']}: only 1 is implemented")
    return cfg, hashlib.sha256(raw).hexdigest()


def git_commit():
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                "benchmarks/feedback"],
                               cwd=ROOT, capture_output=True, text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_grid(cfg, seeds, arm_names, task_list=None):
    task_list = task_list or tasks()
    return [A.run(arm, t, cfg, s) for arm in arm_names for s in seeds for t in task_list]


# --- equal-spend accounting ---------------------------------------------------------------


def unit_of(row, unit):
    if unit == "wall":
        return row["wall_unit"]
    return {"cost": row["unit"], "calls": row["nodes"], "tokens": row["unit_tokens"]}[unit]


def truncate(row, unit, cap_multiple):
    """(completed, spend in units) of this run had its meter refused any call once the spend
    reached cap_multiple units: the same loop stopped earlier (tests check it against a real
    capped run). A run the harness itself cut off (``capped``) that would need more than it
    got is not completed."""
    cap = cap_multiple * unit_of(row, unit)
    if unit == "wall":
        # measured, not replayable: the run as it went, cut at the cap (what it had returned
        # by then; a run still going is not completed)
        return (row["wall_s"] <= cap and not row["capped"],
                min(row["wall_s"], cap) / unit_of(row, unit))
    spent = 0.0
    for cost, tokens in row["log"]:
        if spent >= cap - 1e-9:
            return False, spent / unit_of(row, unit)
        spent += {"cost": cost, "calls": 1, "tokens": tokens}[unit]
    return not row["capped"], spent / unit_of(row, unit)


def at_cap(row, unit, m):
    done, spend = truncate(row, unit, m)
    return {"success": done and row["success"], "wrong": done and row["wrong_accepted"],
            "spend": spend}


def per_seed_curves(rows, unit, caps):
    """arm -> seed -> [(sum success, sum wrong, sum spend, n) per cap]."""
    out: dict = defaultdict(dict)
    for r in rows:
        cur = out[r["arm"]].setdefault(r["seed"], [[0, 0, 0.0, 0] for _ in caps])
        for i, m in enumerate(caps):
            a = at_cap(r, unit, m)
            c = cur[i]
            c[0] += a["success"]
            c[1] += a["wrong"]
            c[2] += a["spend"]
            c[3] += 1
    return out


def curve(per_seed, seeds):
    n = len(per_seed[seeds[0]])
    pts = []
    for i in range(n):
        tot = [0.0, 0.0, 0.0, 0]
        for s in seeds:
            for j in range(4):
                tot[j] += per_seed[s][i][j]
        pts.append((tot[2] / tot[3], tot[0] / tot[3], tot[1] / tot[3]))
    return pts      # (mean spend, success, wrong accepted) per cap


def interpolate(pts, x):
    """Success at mean spend x on a curve of (spend, success) points; None below its first
    point; beyond its last point the arm spends no more: its last success."""
    if x < pts[0][0] - 1e-9:
        return None
    best = None
    for (x0, y0, _w0), (x1, y1, _w1) in zip(pts, pts[1:]):
        if x0 - 1e-9 <= x <= x1 + 1e-9:
            y = y1 if x1 - x0 < 1e-9 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
            best = y if best is None else max(best, y)
    return best if best is not None else pts[-1][1] if x >= pts[-1][0] else pts[0][1]


def q(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(p * len(xs))))]


def equal_spend(rows, unit, caps, points, reps, ref="incr", rng_seed=0):
    ps = per_seed_curves(rows, unit, caps)
    arms = list(ps)
    seeds = sorted(next(iter(ps.values())))
    est = {a: curve(ps[a], seeds) for a in arms}
    rng = random.Random(rng_seed)
    boot = {a: {x: [] for x in points} for a in arms}
    dif = {a: {x: [] for x in points} for a in arms}
    curves_b = {a: [] for a in arms}
    for _ in range(reps if len(seeds) > 1 else 0):
        pick = [rng.choice(seeds) for _ in seeds]
        cs = {a: curve(ps[a], pick) for a in arms}
        for a in arms:
            curves_b[a].append(cs[a])
            for x in points:
                y = interpolate(cs[a], x)
                if y is not None:
                    boot[a][x].append(y)
                if ref in cs:
                    yr = interpolate(cs[ref], x)
                    if y is not None and yr is not None:
                        dif[a][x].append(yr - y)

    def ci(xs):
        return [q(xs, 0.025), q(xs, 0.975)] if xs else None

    out = {"unit": unit, "caps": caps, "points": points, "arms": {},
           "method": f"95% percentile bootstrap over seeds ({len(curves_b[arms[0]])} resamples "
                     f"of {len(seeds)} seeds; curve cells and interpolated points recomputed "
                     f"per resample; differences paired on the same resample)"}
    for a in arms:
        band = [[ci([c[i][j] for c in curves_b[a]]) for j in range(3)]
                for i in range(len(caps))]
        out["arms"][a] = {
            "curve": [{"cap": m, "spend": p[0], "success": p[1], "wrong_accepted": p[2],
                       "spend_ci": band[i][0], "success_ci": band[i][1],
                       "wrong_accepted_ci": band[i][2]}
                      for i, (m, p) in enumerate(zip(caps, est[a]))],
            "at": {str(x): {"success": interpolate(est[a], x), "ci": ci(boot[a][x]),
                            f"{ref}_minus_arm": (interpolate(est[ref], x) - interpolate(est[a], x)
                                                 if ref in est and interpolate(est[a], x) is not None
                                                 and interpolate(est[ref], x) is not None else None),
                            "diff_ci": ci(dif[a][x])} for x in points},
        }
    return out


# --- run-level metrics ----------------------------------------------------------------------

RUN_METRICS = ("success", "wrong_accepted", "escalated", "calls", "tokens", "cost", "latency_s",
               "checks_run", "rounds", "climbs", "kept", "broken_first", "protective_broken",
               "cache_hits", "reused", "reused_accepted", "reuse_unbacked", "reverts",
               "regressions", "rebased", "engine_rebased", "flips", "passes", "revalidated")
MAX_K = 6          # per-attempt tables pool attempt indices >= MAX_K


def boot_mean(rows, metric, reps, rng_seed=0):
    by: dict = defaultdict(lambda: [0.0, 0])
    for r in rows:
        v = r[metric] / r["unit"] if metric == "cost" else r[metric]
        by[r["seed"]][0] += float(v)
        by[r["seed"]][1] += 1
    seeds = sorted(by)
    mean = sum(by[s][0] for s in seeds) / sum(by[s][1] for s in seeds)
    rng = random.Random(rng_seed)
    ms = []
    for _ in range(reps if len(seeds) > 1 else 0):
        pick = [by[rng.choice(seeds)] for _ in seeds]
        ms.append(sum(p[0] for p in pick) / sum(p[1] for p in pick))
    return {"mean": mean, "lo": q(ms, 0.025) if ms else mean, "hi": q(ms, 0.975) if ms else mean}


def summarize_runs(rows, arm_names, reps):
    out = {}
    fams = sorted({r["family"] for r in rows})
    for arm in arm_names:
        rs = [r for r in rows if r["arm"] == arm]
        if not rs:
            continue
        m = {k: boot_mean(rs, k, reps) for k in RUN_METRICS}
        m["families"] = {f: boot_mean([r for r in rs if r["family"] == f], "success", reps)
                         for f in fams}
        ctrl = [r for r in rs if r["control"]]
        m["controls"] = len(ctrl)
        m["controls_lost"] = sum(not r["success"] for r in ctrl)
        m["controls_lost_no_change"] = sum(not r["success"] for r in ctrl
                                           if r["family"] != "upstream")
        m["reasons"] = dict(Counter(r["reason"] for r in rs if r["reason"]))
        m["runs"] = len(rs)
        m["harness_capped"] = sum(r["capped"] for r in rs)
        m["per_round"] = per_round(rs, reps)
        out[arm] = m
    return out


OUTCOMES = ("accepted", "rejected", "reverted", "stopped", "interrupted")


def _per_round_counts(rs, top):
    """The counts behind the per-round rates, summed over rs: a flat dict of integers."""
    c: Counter = Counter()
    for r in rs:
        for k, *v in r["per_attempt"]:
            kk = min(k, MAX_K)
            for name, x in zip(("wb", "fx", "rb", "br", "fr", "fb"), v):
                c[(name, kk)] += x
        for k, oc in r["outcomes_by_attempt"].items():
            kk = min(int(k), MAX_K)
            for o, x in oc.items():
                c[(o, kk)] += x
                c[("n", kk)] += x
        for rnd in range(1, min(r["rounds"], top) + 1):
            c[("reached", rnd)] += 1
        if r["escalated"] and 1 <= r["rounds"] <= top:
            c[("ended", r["rounds"])] += 1
    return c


def _per_round_rates(c, top):
    """name -> value of every per-round rate, from the counts (None where undefined)."""
    rate = (lambda a, b: None if not b else a / b)
    out = {}
    for k in range(1, MAX_K + 1):
        wb, fx, rb, br = c[("wb", k)], c[("fx", k)], c[("rb", k)], c[("br", k)]
        out[("fix_rate", k)] = rate(fx, wb)
        out[("break_rate", k)] = rate(br, rb)
        out[("first_right_break_rate", k)] = rate(c[("fb", k)], c[("fr", k)])
        out[("gain_rate", k)] = rate(fx - br, wb + rb)
    for k in range(0, MAX_K + 1):
        for o in OUTCOMES:
            out[(o, k)] = rate(c[(o, k)], c[("n", k)])
    for rnd in range(1, top + 1):
        out[("escalation", rnd)] = rate(c[("ended", rnd)], c[("reached", rnd)])
    return out


def per_round(rs, reps=0, rng_seed=0):
    """Per attempt index (a node instance's k-th model call after its first; pooled from
    MAX_K): fix rate among those wrong before it, break rate among those right before it
    (and among those whose first answer was right), gain rate = (fixed - broken) / retries
    (the net share of retries at k that made a node's own answer right); for incr arms the
    outcome the loop recorded for its attempt k (k retries after its first, a reused first
    attempt included: k = revision - 1, so it lines up with the model call it came from);
    per loop round the runs that reached it and the runs that ended there escalated.

    Every rate has a 95% bootstrap interval over seeds (``*_ci``): seeds drawn with
    replacement (``reps`` times), the counts of the drawn seeds' runs pooled and the rate
    recomputed (a ratio of sums, as the point estimate); percentile interval, resamples where
    the rate is undefined (no attempt at that index) left out. None without two seeds."""
    top = max((r["rounds"] for r in rs), default=0)
    by_seed: dict = defaultdict(list)
    for r in rs:
        by_seed[r["seed"]].append(r)
    seeds = sorted(by_seed)
    counts = {sd: _per_round_counts(by_seed[sd], top) for sd in seeds}
    total = _per_round_counts(rs, top)
    est = _per_round_rates(total, top)
    boot: dict = defaultdict(list)
    rng = random.Random(rng_seed)
    for _ in range(reps if len(seeds) > 1 else 0):
        c: Counter = Counter()
        for sd in (rng.choice(seeds) for _ in seeds):
            c.update(counts[sd])
        for key, v in _per_round_rates(c, top).items():
            if v is not None:
                boot[key].append(v)

    def ci(key):
        xs = boot.get(key)
        return [q(xs, 0.025), q(xs, 0.975)] if xs else None

    attempts = {}
    for k in range(1, MAX_K + 1):
        if not (total[("wb", k)] or total[("rb", k)]):
            continue
        a = {"wrong_before": total[("wb", k)], "right_before": total[("rb", k)],
             "first_right_before": total[("fr", k)]}
        for name in ("fix_rate", "break_rate", "first_right_break_rate", "gain_rate"):
            a[name] = est[(name, k)]
            a[name[:-5] + "_ci"] = ci((name, k))
        attempts[str(k)] = a
    outcomes = {}
    for k in range(0, MAX_K + 1):
        if not total[("n", k)]:
            continue
        o = {"n": total[("n", k)]}
        for name in OUTCOMES:
            o[name] = est[(name, k)]
            o[name + "_ci"] = ci((name, k))
        outcomes[str(k)] = o
    esc = {}
    for rnd in range(1, top + 1):
        esc[str(rnd)] = {"reached": total[("reached", rnd)],
                         "escalated_here": total[("ended", rnd)],
                         "rate": est[("escalation", rnd)], "ci": ci(("escalation", rnd))}
    return {"method": f"95% percentile bootstrap over seeds ({reps if len(seeds) > 1 else 0} "
                      f"resamples of {len(seeds)} seeds; each rate a ratio of pooled counts)",
            "attempts": attempts, "outcomes": outcomes, "escalation_by_round": esc}


def per_task(rows):
    """task -> arm -> means over seeds (uncapped): success, wrong accepted, calls, reused,
    reused and accepted (model calls avoided), reverts, rebased."""
    by: dict = defaultdict(list)
    for r in rows:
        by[(r["task"], r["arm"])].append(r)
    out: dict = defaultdict(dict)
    for (task, arm), rs in by.items():
        out[task][arm] = {m: sum(float(r[m]) for r in rs) / len(rs)
                          for m in ("success", "wrong_accepted", "calls", "reused",
                                    "reused_accepted", "reverts", "rebased")}
    return dict(out)


KOR_METRICS = ("success", "wrong_accepted", "escalated", "cost", "calls", "broken_first")


def keep_or_revert(rows, reps, on="incr", off="incr_norevert", rng_seed=2):
    """The value of keep-or-revert: ``on`` - ``off``, paired by (seed, task), uncapped, with a
    95% bootstrap CI over seeds; and the same restricted to the runs where it acted (``on``
    built a retry on an earlier revision than the latest; elsewhere the two arms run the same
    calls, so every difference comes from those runs)."""
    a = {(r["seed"], r["task"]): r for r in rows if r["arm"] == on}
    b = {(r["seed"], r["task"]): r for r in rows if r["arm"] == off}
    keys = sorted(set(a) & set(b))
    if not keys:
        return None
    seeds = sorted({k[0] for k in keys})
    acted = [k for k in keys if a[k]["rebased"]]

    def val(r, m):
        return r[m] / r["unit"] if m == "cost" else float(r[m])

    def diff(ks, rng):
        by: dict = defaultdict(list)
        for k in ks:
            by[k[0]].append(k)
        out = {}
        for m in KOR_METRICS:
            d = lambda kk: sum(val(a[k], m) - val(b[k], m) for k in kk)
            est = d(ks) / len(ks) if ks else None
            sums = {sd: (d(by[sd]), len(by[sd])) for sd in seeds}
            bs = []
            for _ in range(reps if len(seeds) > 1 and ks else 0):
                pick = [sums[rng.choice(seeds)] for _ in seeds]
                n = sum(p[1] for p in pick)
                if n:
                    bs.append(sum(p[0] for p in pick) / n)
            out[m] = {"on": sum(val(a[k], m) for k in ks) / len(ks) if ks else None,
                      "off": sum(val(b[k], m) for k in ks) / len(ks) if ks else None,
                      "diff": est, "ci": [q(bs, 0.025), q(bs, 0.975)] if bs else None}
        return out

    same = sum(1 for k in keys if not a[k]["rebased"] and a[k]["log"] == b[k]["log"]
               and a[k]["success"] == b[k]["success"])
    rng = random.Random(rng_seed)
    return {"on": on, "off": off, "runs": len(keys), "acted": len(acted),
            "identical_where_not_acted": same, "not_acted": len(keys) - len(acted),
            "all": diff(keys, rng), "where_acted": diff(acted, rng)}


def flaky(cfg, arm_names, seeds, clean_rows, reps):
    """The flaky-validator condition (pre-registered rate), paired with the clean run on the
    same seeds: success, wrong accepted, escalated, and clean - flaky with a bootstrap CI."""
    p = cfg["harness"]["flaky_p"]
    c2 = {k: dict(v) for k, v in cfg.items()}
    c2["validator"]["p_flaky"] = p
    rows = run_grid(c2, seeds, arm_names)
    out = {"p_flaky": p, "seeds": [seeds[0], seeds[-1]], "arms": {}}
    for arm in arm_names:
        fr = [r for r in rows if r["arm"] == arm]
        cr = [r for r in clean_rows if r["arm"] == arm and r["seed"] in set(seeds)]
        by_f, by_c = defaultdict(list), defaultdict(list)
        for r in fr:
            by_f[r["seed"]].append(r["success"])
        for r in cr:
            by_c[r["seed"]].append(r["success"])
        rng = random.Random(1)
        diffs = []
        for _ in range(reps if len(seeds) > 1 else 0):
            pick = [rng.choice(seeds) for _ in seeds]
            a = sum(sum(by_c[x]) for x in pick) / sum(len(by_c[x]) for x in pick)
            b = sum(sum(by_f[x]) for x in pick) / sum(len(by_f[x]) for x in pick)
            diffs.append(a - b)
        out["arms"][arm] = {
            "success": boot_mean(fr, "success", reps), "clean_success": boot_mean(cr, "success", reps),
            "clean_minus_flaky": boot_mean(cr, "success", 0)["mean"] - boot_mean(fr, "success", 0)["mean"],
            "diff_ci": [q(diffs, 0.025), q(diffs, 0.975)] if diffs else None,
            "wrong_accepted": boot_mean(fr, "wrong_accepted", reps),
            "clean_wrong_accepted": boot_mean(cr, "wrong_accepted", 0)["mean"],
            "escalated": boot_mean(fr, "escalated", 0)["mean"],
            "cost": boot_mean(fr, "cost", 0)["mean"],
            "flips": boot_mean(fr, "flips", 0)["mean"],
            "reasons": dict(Counter(r["reason"] for r in fr if r["reason"])),
        }
    return out


def walltime_rows(cfg, arm_names, seeds, task_list=None):
    """Real threads, real sleeps: every arm on every task, each call's simulated latency slept
    (``walltime_scale`` real seconds per simulated second) and each run's wall time measured
    with ``time.perf_counter`` around the arm (the harness's and the engine's own work
    included). Concurrency: a plain arm makes the independent calls of one graph level at
    once (4 threads); ``incr_par`` is the engine with ``max_workers=4`` demanding through
    ``incr.gather``; ``incr``, ``incr_norevert`` and ``incr_reuse`` run as in the main run
    (``max_workers=1``). Each row records the peak number of model calls in flight."""
    scale = cfg["harness"]["walltime_scale"]
    rows = []
    for arm in arm_names:
        for s in seeds:
            for t in task_list or tasks():
                ctx = A.Ctx(arm, t, cfg, s, sleep_scale=scale)
                if arm not in A.INCR_ARMS:
                    ctx.workers = 4
                t0 = time.perf_counter()
                out = A.execute(ctx)
                wall = time.perf_counter() - t0
                r = A.score(ctx, out)
                r["wall_s"] = wall
                r["wall_unit"] = A.unit_latency(t, cfg) * scale
                r["peak_in_flight"] = ctx.peak_in_flight
                rows.append(r)
    return rows


def walltime(cfg, arm_names, seeds, reps, main_rows=(), task_list=None):
    """The wall-time run: per arm the measured seconds per task, the serial sum of its sleeps,
    the peak calls in flight, how many runs made the same calls with the same outcome as the
    main (serial, no sleep) run, and success against measured wall time as a curve with
    seed-bootstrap intervals (``equal_spend`` with the unit ``wall``)."""
    rows = walltime_rows(cfg, arm_names, seeds, task_list)
    main = {(r["arm"], r["seed"], r["task"]): r for r in main_rows}
    out = {"arms": {}}
    for arm in arm_names:
        rs = [r for r in rows if r["arm"] == arm]
        pairs = [(r, main[(arm, r["seed"], r["task"])]) for r in rs
                 if (arm, r["seed"], r["task"]) in main]
        out["arms"][arm] = {
            "wall_s_per_task": sum(r["wall_s"] for r in rs) / len(rs),
            "wall_units_per_task": sum(r["wall_s"] / r["wall_unit"] for r in rs) / len(rs),
            "simulated_serial_latency_s_per_task":
                sum(r["latency_s"] for r in rs) / len(rs) * cfg["harness"]["walltime_scale"],
            "success": sum(r["success"] for r in rs) / len(rs), "runs": len(rs),
            "peak_in_flight_max": max(r["peak_in_flight"] for r in rs),
            "runs_with_calls_at_once": sum(r["peak_in_flight"] >= 2 for r in rs),
            # the same calls (as a multiset: threads may reorder them) and the same outcome
            "same_as_main_run": sum(1 for r, m in pairs if sorted(r["log"]) == sorted(m["log"])
                                    and r["success"] == m["success"]),
            "compared_with_main_run": len(pairs),
        }
    h = cfg["harness"]
    out["curve"] = equal_spend(rows, "wall", h["cap_multiples"], h["equal_spend_points"], reps)
    return out


# --- printing ------------------------------------------------------------------------------


def f3(x):
    return "  -  " if x is None else f"{x:.2f}"


def fci(d):
    return f"{d['mean']:.2f} [{d['lo']:.2f},{d['hi']:.2f}]"


def print_all(res, w=None):
    w = w or sys.stdout.write
    w(f"\n{res['model']}\nconfig {res['config_sha256'][:12]} at commit {res['git_commit']}; "
      f"seeds {res['seeds'][0]}-{res['seeds'][1]}; {len(res['tasks'])} tasks\n\n")
    def curve_table(unit, title):
        eq = res["equal_spend"][unit]
        w(title + "\n(each cell: success [95% bootstrap CI over seeds] @ mean spend)\n")
        w(f"{'arm':<13} " + " ".join(f"{'cap ' + str(m):>24}" for m in eq["caps"]) + "\n")
        for arm, d in eq["arms"].items():
            w(f"{arm:<13} " + " ".join(
                f"{p['success']:.2f} [{(p['success_ci'] or [p['success']] * 2)[0]:.2f},"
                f"{(p['success_ci'] or [p['success']] * 2)[1]:.2f}] @{p['spend']:5.2f}"
                for p in d["curve"]) + "\n")

    curve_table("cost", "success vs spend (cost, in units of one base-model first call per node; "
                        "mean per task, success = accepted AND passes hidden checks)")
    if "wall" in res["equal_spend"]:
        w("\n")
        curve_table("wall", f"success vs MEASURED wall time (the wall-time run, "
                            f"{res.get('walltime_seeds')} seeds; unit: the simulated latency of one "
                            f"first call per node, one after the other, x walltime_scale; a run "
                            f"not returned by the cap is not a success)")
    for unit in res["equal_spend"]:
        e = res["equal_spend"][unit]
        w(f"\nat equal mean spend ({unit}; 95% bootstrap CI over seeds; incr - arm, paired)\n")
        w(f"{'arm':<13} " + " ".join(f"{'spend ' + str(x):>34}" for x in e["points"]) + "\n")
        for arm, d in e["arms"].items():
            cells = []
            for x in e["points"]:
                a = d["at"][str(x)]
                if a["success"] is None:
                    cells.append(f"{'(cannot spend this little)':>34}")
                    continue
                ci = a["ci"] or [a["success"]] * 2
                dd = a["incr_minus_arm"]
                dc = a["diff_ci"]
                cells.append(f"{a['success']:.2f} [{ci[0]:.2f},{ci[1]:.2f}] "
                             + (f"d {dd:+.2f} [{dc[0]:+.2f},{dc[1]:+.2f}]" if dd is not None and dc
                                else " " * 20))
            w(f"{arm:<13} " + " ".join(f"{c:>34}" for c in cells) + "\n")
    runs = res["runs"]
    w(f"\nrun-level, uncapped except by the harness (mean per task [95% CI]); cost in units\n")
    w(f"{'arm':<13} {'success':<17} {'wrong accepted':<17} {'escalated':<9} {'calls':<6} "
      f"{'cost':<6} {'checks':<6} {'rounds':<6} {'climbs':<6} {'kept':<5} {'broken1st':<9} "
      f"{'protect':<7} {'ctrl lost':<10} reasons\n")
    for arm, m in runs.items():
        w(f"{arm:<13} {fci(m['success']):<17} {fci(m['wrong_accepted']):<17} "
          f"{m['escalated']['mean']:<9.2f} {m['calls']['mean']:<6.1f} {m['cost']['mean']:<6.2f} "
          f"{m['checks_run']['mean']:<6.1f} {m['rounds']['mean']:<6.2f} "
          f"{m['climbs']['mean']:<6.2f} {m['kept']['mean']:<5.2f} "
          f"{m['broken_first']['mean']:<9.3f} {m['protective_broken']['mean']:<7.3f} "
          f"{str(m['controls_lost']) + '/' + str(m['controls']):<10} {m['reasons']}\n")
    w("\nincr arms: model calls avoided and loop control, per task (events via rt.on_event, "
      "attempts via rt.state)\n")
    for arm, m in runs.items():
        if arm in A.INCR_ARMS:
            w(f"{arm:<13} reused {m['reused']['mean']:.2f}  reused+accepted (calls avoided) "
              f"{m['reused_accepted']['mean']:.2f}  PASS {m['passes']['mean']:.2f}  re-validated "
              f"without a call {m['revalidated']['mean']:.2f}  accepted without an ACK "
              f"{m['reuse_unbacked']['mean']:.3f}  regressions {m['regressions']['mean']:.2f}  "
              f"reverts {m['reverts']['mean']:.2f}  retries built on an earlier revision "
              f"{m['rebased']['mean']:.2f} (the engine handed one: "
              f"{m['engine_rebased']['mean']:.2f})\n")
    pr0 = next(iter(runs.values()))["per_round"]
    w("\nper attempt index k (a node instance's k-th model call after its first; k=6 pools "
      "6+): fix = wrong->right, brk = right->wrong, brk1 = right->wrong where the first answer "
      "was right, gain = (fixed - broken) / retries; incr arms: share of attempts k (revision "
      f"k+1) reverted / stopped on. [{pr0.get('method', '')}]\n")
    w(f"{'arm':<13} {'k':>2} {'n':>6}  {'fix':<17} {'brk':<17} {'brk1':<17} {'gain':<18} "
      f"{'rv':<17} {'st':<17}\n")

    def fc(v, c, sign=False):
        if v is None:
            return "  -"
        fmt = "{:+.2f}" if sign else "{:.2f}"
        return (fmt.format(v) + (f" [{fmt.format(c[0])},{fmt.format(c[1])}]" if c else ""))

    for arm, m in runs.items():
        pr = m["per_round"]
        if not pr["attempts"]:
            continue
        for k in range(1, MAX_K + 1):
            a = pr["attempts"].get(str(k))
            if not a:
                continue
            o = pr["outcomes"].get(str(k)) if arm in A.INCR_ARMS else None
            w(f"{arm if k == 1 else '':<13} {k:>2} {a['wrong_before'] + a['right_before']:>6}  "
              f"{fc(a['fix_rate'], a['fix_ci']):<17} {fc(a['break_rate'], a['break_ci']):<17} "
              f"{fc(a['first_right_break_rate'], a['first_right_break_ci']):<17} "
              f"{fc(a['gain_rate'], a['gain_ci'], True):<18} "
              f"{fc(o['reverted'], o['reverted_ci']) if o else '':<17} "
              f"{fc(o['stopped'], o['stopped_ci']) if o else '':<17}\n")
    w("\nescalation by loop round (runs ending not accepted at round r / runs reaching r; "
      "95% CI over seeds; rounds reached by >= 20 runs)\n")
    for arm, m in runs.items():
        e = m["per_round"]["escalation_by_round"]
        w(f"{arm:<13} " + " ".join(f"r{r}:{fc(v['rate'], v['ci'])}" for r, v in e.items()
                                   if v["reached"] >= 20) + "\n")
    pt = res.get("per_task") or {}
    fam = {t["id"]: t["family"] for t in res["tasks"]}
    shown = [t for t in pt if fam.get(t) == "instances" and "incr" in pt[t]
             and "incr_reuse" in pt[t]]
    if shown:
        w("\nthe instances family per task (means over seeds, uncapped; avoided = reused and "
          "accepted / reused)\n")
        for t in shown:
            w(f"{t:<27} " + " | ".join(
                f"{arm} calls {d['calls']:.1f} succ {d['success']:.2f} wrong "
                f"{d['wrong_accepted']:.2f} avoided {d['reused_accepted']:.2f}/{d['reused']:.2f}"
                for arm, d in pt[t].items() if arm in ("incr", "incr_reuse")) + "\n")
    fams = list(next(iter(runs.values()))["families"])
    cov = {f: [t["coverage"] for t in res["tasks"] if t["family"] == f] for f in fams}
    w("\nsuccess per family (uncapped); coverage = share of aspects with a visible or protective "
      "check, mean over the family's tasks\n" + f"{'arm':<13} " + " ".join(f"{f:>18}" for f in fams)
      + "\n" + f"{'coverage':<13} " + " ".join(
          f"{sum(cov[f]) / len(cov[f]) if cov[f] else 0:>18.2f}" for f in fams) + "\n")
    for arm, m in runs.items():
        w(f"{arm:<13} " + " ".join(f"{fci(m['families'][f]):>18}" for f in fams) + "\n")
    kor = res.get("keep_or_revert")
    if kor:
        w(f"\nkeep-or-revert: {kor['on']} - {kor['off']}, paired by (seed, task), uncapped, 95% "
          f"CI over seeds; it acted (a retry built on an earlier revision) in {kor['acted']} of "
          f"{kor['runs']} runs; the other {kor['not_acted']} ran the same calls in both arms "
          f"({kor['identical_where_not_acted']} identical)\n")
        for part in ("all", "where_acted"):
            w(f"  {part:<12} " + "  ".join(
                f"{m} {d['on']:.3f} vs {d['off']:.3f} d {d['diff']:+.3f}"
                + (f" [{d['ci'][0]:+.3f},{d['ci'][1]:+.3f}]" if d["ci"] else "")
                for m, d in kor[part].items() if d["diff"] is not None) + "\n")
    if res.get("walltime"):
        w(f"\nmeasured wall time (real threads; sleeps of {res['config']['harness']['walltime_scale']}"
          f" s per simulated s; {res['walltime_seeds']} seeds)\n")
        for arm, d in res["walltime"].items():
            w(f"{arm:<13} wall {d['wall_s_per_task'] * 1000:7.1f} ms/task ({d['wall_units_per_task']:.2f}"
              f" units)   serial sum of sleeps {d['simulated_serial_latency_s_per_task'] * 1000:7.1f}"
              f" ms/task   success {d['success']:.2f}   calls at once: peak "
              f"{d.get('peak_in_flight_max', '-')}, in {d.get('runs_with_calls_at_once', '-')} of "
              f"{d['runs']} runs   same calls and outcome as the main run "
              f"{d.get('same_as_main_run', '-')}/{d.get('compared_with_main_run', '-')}\n")
    if res.get("flaky"):
        fl = res["flaky"]
        w(f"\nflaky validators (pre-registered p_flaky = {fl['p_flaky']}; seeds "
          f"{fl['seeds'][0]}-{fl['seeds'][1]}; paired with the clean run on the same seeds)\n")
        for arm, d in fl["arms"].items():
            ci = d["diff_ci"] or [d["clean_minus_flaky"]] * 2
            w(f"{arm:<13} success {fci(d['success'])} (clean {d['clean_success']['mean']:.2f}; "
              f"clean-flaky {d['clean_minus_flaky']:+.2f} [{ci[0]:+.2f},{ci[1]:+.2f}])  wrong "
              f"accepted {d['wrong_accepted']['mean']:.2f} (clean {d['clean_wrong_accepted']:.2f})"
              f"  escalated {d['escalated']:.2f}  cost {d['cost']:.2f}  flips {d['flips']:.1f}  "
              f"{d['reasons']}\n")
    if res.get("sweep"):
        w("\nEXPLORATORY sensitivity (not pre-registered): uncapped success / mean cost\n")
        for sw in res["sweep"]:
            w(f"  {sw['set']}: " + "  ".join(f"{a} {v['success']:.2f}/{v['cost']:.2f}"
                                            for a, v in sw["arms"].items()) + "\n")
    w(f"\n{res['model']}\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.feedback")
    ap.add_argument("--quick", action="store_true", help="the config's quick_seeds, no "
                                                         "wall-time run, no sweep")
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--arms", default=",".join(A.ARMS))
    ap.add_argument("--config", default=str(CONFIG))
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override a pre-registered parameter (recorded as a deviation)")
    ap.add_argument("--sweep", action="store_true", help="add the exploratory sensitivity run")
    ap.add_argument("--tasks", default=None, metavar="ID,ID|FAMILY,...",
                    help="run only these tasks (ids or families)")
    ap.add_argument("--model", default=None, metavar="openai:NAME",
                    help="a REAL model behind an OpenAI-compatible endpoint instead of the "
                         "simulation (key: OPENAI_API_KEY; none needed with a local "
                         "--base-url); no wall-time run, no flaky condition, no sweep")
    ap.add_argument("--base-url", default=None, metavar="URL",
                    help="the endpoint of --model, e.g. http://localhost:8080/v1")
    ap.add_argument("--temperature", type=float, default=0.7,
                    help="sampling temperature of --model (default 0.7: a resample must be "
                         "able to differ)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--plot", default=None)
    a = ap.parse_args(argv)
    real = None
    if a.model is not None:
        kind, _, name = a.model.partition(":")
        if kind != "openai" or not name:
            ap.error(f"--model {a.model!r}: expected openai:NAME (an OpenAI-compatible chat "
                     f"endpoint; --base-url for a local server)")
        if a.sweep:
            ap.error("--sweep varies the simulated model's parameters: not with --model")
        from benchmarks.feedback.real import ChatModel
        real = ChatModel(load_config(a.config, a.set)[0], name, a.base_url,
                         temperature=a.temperature)
        if a.arms == ",".join(A.ARMS):
            a.arms = ",".join(x for x in A.ARMS if x != "strong")
    elif a.base_url is not None:
        ap.error("--base-url goes with --model openai:NAME")
    prev = A.use_model(real)
    try:
        return _main(a, argv, real)
    finally:
        A.use_model(prev)


def _main(a, argv, real) -> int:
    t0 = time.perf_counter()
    cfg, sha = load_config(a.config, a.set)
    h = cfg["harness"]
    n = a.seeds if a.seeds is not None else (h["quick_seeds"] if a.quick else h["seeds"])
    seeds = list(range(a.first_seed, a.first_seed + n))
    arm_names = [x for x in a.arms.split(",") if x]
    for x in arm_names:
        if x not in A.ARMS:
            raise SystemExit(f"--arms: unknown arm {x!r}; choose from {', '.join(A.ARMS)}")
        if real is not None and x == "strong":
            raise SystemExit("--arms: strong is the simulated stronger model; with --model, "
                             "leave it out")
    task_list = tasks()
    if a.tasks:
        want = {x for x in a.tasks.split(",") if x}
        task_list = [t for t in task_list if t.id in want or t.family in want]
        unknown = want - {t.id for t in tasks()} - {t.family for t in tasks()}
        if unknown or not task_list:
            raise SystemExit(f"--tasks: no task or family {sorted(unknown)}; tasks: "
                             f"{', '.join(t.id for t in tasks())}")
    reps = 200 if a.quick else h["bootstrap_reps"]
    rows = run_grid(cfg, seeds, arm_names, task_list)
    caps = h["cap_multiples"]
    res = {
        "model": (f"{LABEL}: every figure is SIMULATED" if real is None else
                  f"{real.label} (temperature {a.temperature}): figures from a REAL model on "
                  f"abstract tasks whose prompt states the values asked for"),
        "simulated": real is None,
        "real_model": None if real is None else {"name": real.name, "base_url": real.base_url,
                                                 "temperature": a.temperature},
        "config": cfg, "config_sha256": sha, "deviations": a.set,
        "git_commit": git_commit(), "seeds": [seeds[0], seeds[-1]], "arms": arm_names,
        "tasks": [{"id": t.id, "family": t.family, "control": t.control,
                   "nodes": len(t.nodes), "visible_checks": len(t.visible),
                   "hidden_checks": len(t.hidden_names), "coverage": round(t.coverage(), 3)}
                  for t in task_list],
        "equal_spend": {u: equal_spend(rows, u, caps, h["equal_spend_points"], reps)
                        for u in UNITS},
        "runs": summarize_runs(rows, arm_names, reps),
    }
    kor = keep_or_revert(rows, reps)
    if kor:
        res["keep_or_revert"] = kor
    res["per_task"] = per_task(rows)
    if not a.quick and real is None:
        ws = list(range(h["walltime_seeds"]))
        res["walltime_seeds"] = len(ws)
        wt = walltime(cfg, arm_names, ws, reps, rows, task_list)
        res["walltime"] = wt["arms"]
        res["equal_spend"]["wall"] = wt["curve"]
        fs = list(range(seeds[0], seeds[0] + min(len(seeds), h["flaky_seeds"])))
        res["flaky"] = flaky(cfg, arm_names, fs, rows, reps)
    if a.sweep:
        res["sweep"] = []
        sarms = [x for x in ("resample", "whole", "cache", "recheck", "incr", "incr_reuse")
                 if x in arm_names]
        ns = h["sweep_seeds"]
        for over in (["model.p_fix=0.8"], ["model.p_vague=0.8"],
                     ["model.p_overfit=0.0"], ["model.p_repeat=0.0"], ["incr.patience=4"]):
            c2, _ = load_config(a.config, a.set + over)
            rs = run_grid(c2, seeds[:ns], sarms)
            res["sweep"].append({"set": over, "seeds": ns, "arms": {
                x: {"success": sum(r["success"] for r in rs if r["arm"] == x)
                    / sum(1 for r in rs if r["arm"] == x),
                    "cost": sum(r["cost"] / r["unit"] for r in rs if r["arm"] == x)
                    / sum(1 for r in rs if r["arm"] == x)} for x in sarms}})
    res["seconds"] = round(time.perf_counter() - t0, 1)
    res["command"] = "python -m benchmarks.feedback " + " ".join(
        argv if argv is not None else sys.argv[1:])
    import incr
    res["incr"] = incr.__version__
    res["python"] = sys.version.split()[0]
    print_all(res)
    out = Path(a.out) if a.out else HERE / ("results-real.json" if real is not None else
                                            "results-quick.json" if a.quick else "results.json")
    out.write_text(json.dumps(res, indent=1) + "\n")
    if real is not None:
        tr = out.with_suffix(".transcripts.jsonl")
        tr.write_text("".join(json.dumps(x, sort_keys=True, default=str) + "\n"
                              for x in real.transcript))
        print(f"{len(real.transcript)} model calls transcribed in {tr}")
    plot = a.plot or (None if a.quick or real is not None else
                      str(ROOT / "docs" / "evaluation.svg"))
    if plot:
        from benchmarks.feedback.plot import svg
        Path(plot).write_text(svg(res))
    print(f"{len(rows)} runs in {res['seconds']} s; results in {out}"
          + (f"; plot in {plot}" if plot else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
