"""``python -m benchmarks.feedback``: run the arms, print the tables, write JSON and the plot."""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from benchmarks.feedback import arms as A
from benchmarks.feedback.model import LABEL, SimModel, SimParams
from benchmarks.feedback.tasks import tasks

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

METRICS = ("success", "calls", "tokens", "latency_s", "checks_run", "wrong_stable",
           "broken_first", "control_broken", "rounds", "rollbacks", "escalated",
           "stale_verdicts")
SWEEP = [(pf, pb) for pf in (0.2, 0.5, 0.8) for pb in (0.05, 0.3)]


def run_grid(model_for, seeds, scenarios, arm_names, flip, task_list=None):
    task_list = task_list or tasks()
    rows = []
    for sc in scenarios:
        for arm in arm_names:
            for s in seeds:
                model = model_for(s)
                for t in task_list:
                    rows.append(A.run(arm, t, sc, model, s, flip))
    return rows


def bootstrap(rows, metric, reps, rng_seed=0):
    """Mean per task, with a 95% bootstrap interval over seeds (the unit of resampling)."""
    by_seed: dict = {}
    for r in rows:
        v = r[metric]
        a = by_seed.setdefault(r["seed"], [0.0, 0])
        a[0] += float(v)
        a[1] += 1
    seeds = sorted(by_seed)
    tot = sum(by_seed[s][0] for s in seeds)
    n = sum(by_seed[s][1] for s in seeds)
    mean = tot / n if n else float("nan")
    rng = random.Random(rng_seed)
    means = []
    for _ in range(reps if len(seeds) > 1 else 0):
        pick = [by_seed[rng.choice(seeds)] for _ in seeds]
        means.append(sum(p[0] for p in pick) / max(1, sum(p[1] for p in pick)))
    means.sort()
    lo = means[int(0.025 * len(means))] if means else mean
    hi = means[int(0.975 * len(means)) - 1] if means else mean
    return {"mean": mean, "lo": lo, "hi": hi}


def summarize(rows, scenarios, arm_names, reps):
    out = {}
    for sc in scenarios:
        for arm in arm_names:
            rs = [r for r in rows if r["scenario"] == sc and r["arm"] == arm]
            if not rs:
                continue
            m = {k: bootstrap(rs, k, reps) for k in METRICS}
            ctrl = [r for r in rs if r["control"]]
            m["controls"] = len(ctrl)
            m["controls_broken"] = sum(r["control_broken"] for r in ctrl)
            m["wrong_stable_count"] = sum(r["wrong_stable"] for r in rs)
            m["tasks"] = len(rs)
            reasons: dict = {}
            for r in rs:
                if r["escalation"]:
                    reasons[r["escalation"]] = reasons.get(r["escalation"], 0) + 1
            m["escalations"] = reasons
            m["calls_per_success"] = (m["calls"]["mean"] / m["success"]["mean"]
                                      if m["success"]["mean"] else None)
            m["per_round"] = per_round(rs)
            out[f"{sc}/{arm}"] = m
    return out


def per_round(rs):
    """Share of tasks whose nodes all hold hidden-correct candidates after round r, and the
    marginal fixes, breaks and net gain of each round (per 100 tasks)."""
    n = len(rs)
    out = []
    prev = [False] * n
    for r in range(A.MAX_TICKS):
        cur = [x["per_round"][r] for x in rs]
        used = sum(1 for x in rs if x["rounds"] > r)
        fixed = sum(1 for a, b in zip(prev, cur) if not a and b)
        broke = sum(1 for a, b in zip(prev, cur) if a and not b)
        out.append({"round": r + 1, "correct": sum(cur) / n, "tasks_generating": used,
                    "fixed_per_100": 100 * fixed / n, "broken_per_100": 100 * broke / n,
                    "net_per_100": 100 * (fixed - broke) / n})
        prev = cur
        if used == 0:
            break
    return out


def fmt(m, k, scale=1.0, digits=2):
    x = m[k]
    return f"{x['mean'] * scale:.{digits}f} [{x['lo'] * scale:.{digits}f},{x['hi'] * scale:.{digits}f}]"


def print_main(summary, scenarios, arm_names, label, out=sys.stdout):
    w = out.write
    w(f"\nmodel: {label}\n")
    w("mean per task, 95% bootstrap interval over seeds; success = returned as accepted AND "
      "passes the hidden checks\n")
    head = (f"{'scenario':<9} {'arm':<9} {'success':<18} {'model calls':<18} {'tokens':<16} "
            f"{'latency s':<10} {'checks':<7} {'wrong stable':<18} {'broken 1st':<10} "
            f"{'ctrl lost':<11} {'rounds':<6} {'rollbk':<6} {'escalated':<9} {'calls/success':<13}\n")
    w(head)
    w("-" * (len(head) - 1) + "\n")
    for sc in scenarios:
        for arm in arm_names:
            m = summary.get(f"{sc}/{arm}")
            if m is None:
                continue
            cps = f"{m['calls_per_success']:.2f}" if m["calls_per_success"] else "-"
            w(f"{sc:<9} {arm:<9} {fmt(m, 'success'):<18} {fmt(m, 'calls'):<18} "
              f"{m['tokens']['mean']:<16.0f} {m['latency_s']['mean']:<10.2f} "
              f"{m['checks_run']['mean']:<7.1f} {fmt(m, 'wrong_stable'):<18} "
              f"{m['broken_first']['mean']:<10.3f} "
              f"{str(m['controls_broken']) + '/' + str(m['controls']):<11} "
              f"{m['rounds']['mean']:<6.2f} {m['rollbacks']['mean']:<6.2f} "
              f"{m['escalated']['mean']:<9.2f} {cps:<13}\n")
        w("\n")


def print_rounds(summary, sc, arm_names, out=sys.stdout):
    w = out.write
    w(f"per round ({sc}): share of tasks all-correct on hidden checks after round r; "
      f"net = fixed - broken per 100 tasks\n")
    w(f"{'arm':<9} " + " ".join(f"{'r' + str(r):>14}" for r in range(1, 6)) + "\n")
    for arm in arm_names:
        m = summary.get(f"{sc}/{arm}")
        if m is None:
            continue
        cells = []
        for p in m["per_round"][:5]:
            cells.append(f"{p['correct']:.3f}" + (f" {p['net_per_100']:+5.1f}" if p["round"] > 1 else " " * 6))
        w(f"{arm:<9} " + " ".join(f"{c:>14}" for c in cells) + "\n")
    w("\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.feedback")
    ap.add_argument("--quick", action="store_true", help="20 seeds, no sweep")
    ap.add_argument("--seeds", type=int, default=None, help="number of seeds (default 200)")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--scenarios", default=",".join(A.SCENARIOS))
    ap.add_argument("--arms", default=",".join(A.ARMS))
    ap.add_argument("--p-first", type=float, default=SimParams.p_first)
    ap.add_argument("--p-fix", type=float, default=SimParams.p_fix)
    ap.add_argument("--p-break", type=float, default=SimParams.p_break)
    ap.add_argument("--p-repeat", type=float, default=SimParams.p_repeat)
    ap.add_argument("--flip", type=float, default=0.1, help="flaky scenario: flip rate")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--model", default=None, help="openai:NAME for a real endpoint")
    ap.add_argument("--base-url", default=None)
    ap.add_argument("--out", default=None, help="results JSON path")
    ap.add_argument("--plot", default=None, help="SVG path (default docs/evaluation.svg on a "
                                                   "full simulated run; none otherwise)")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    nseeds = a.seeds if a.seeds is not None else (20 if a.quick else 200)
    seeds = list(range(a.first_seed, a.first_seed + nseeds))
    scenarios = [s for s in a.scenarios.split(",") if s]
    arm_names = [s for s in a.arms.split(",") if s]
    for s in scenarios:
        if s not in A.SCENARIOS:
            ap.error(f"unknown scenario {s!r}; choose from {', '.join(A.SCENARIOS)}")
    for s in arm_names:
        if s not in A.ARMS:
            ap.error(f"unknown arm {s!r}; choose from {', '.join(A.ARMS)}")
    params = SimParams(a.p_first, a.p_fix, a.p_break, a.p_repeat)
    real = a.model is not None
    if real:
        kind, _, name = a.model.partition(":")
        if kind != "openai" or not name:
            ap.error(f"--model must look like openai:MODEL_NAME, got {a.model!r}")
        from benchmarks.feedback.model import ChatModel
        chat = ChatModel(name, a.base_url)
        label = chat.label
        model_for = lambda s: chat  # noqa: E731 - one client for every seed
    else:
        label = f"{LABEL}; parameters {params.as_dict()}"
        model_for = lambda s: SimModel(params, s)  # noqa: E731
    reps = 200 if a.quick else 1000
    rows = run_grid(model_for, seeds, scenarios, arm_names, a.flip)
    summary = summarize(rows, scenarios, arm_names, reps)
    print_main(summary, scenarios, arm_names, label)
    for sc in scenarios:
        print_rounds(summary, sc, arm_names)
    sweep = []
    if not (a.quick or a.no_sweep or real):
        sseeds = seeds[:100]
        for pf, pb in SWEEP:
            p = SimParams(pf, a.p_fix, pb, a.p_repeat)
            rs = run_grid(lambda s: SimModel(p, s), sseeds, ["clean"], arm_names, a.flip)
            sm = summarize(rs, ["clean"], arm_names, 200)
            sweep.append({"params": p.as_dict(), "seeds": len(sseeds),
                          "arms": {arm: {k: sm[f"clean/{arm}"][k] for k in
                                         ("success", "calls", "wrong_stable", "broken_first")}
                                   for arm in arm_names}})
        print(f"sweep (clean, {len(sseeds)} seeds; {LABEL}): mean success / model calls per task")
        print(f"{'p_first':<8} {'p_break':<8} " + " ".join(f"{arm:>16}" for arm in arm_names))
        for sw in sweep:
            p = sw["params"]
            print(f"{p['p_first']:<8} {p['p_break']:<8} " + " ".join(
                f"{sw['arms'][arm]['success']['mean']:>7.3f} / {sw['arms'][arm]['calls']['mean']:<6.2f}"
                for arm in arm_names))
        print()
    import incr

    seconds = time.perf_counter() - t0
    result = {
        "model": label, "simulated": not real, "params": params.as_dict() if not real else None,
        "seeds": [seeds[0], seeds[-1]], "scenarios": scenarios, "arms": arm_names,
        "flip": a.flip, "tasks": [{"id": t.id, "family": t.family, "control": t.control,
                                   "nodes": [n.name for n in t.nodes],
                                   "budget": list(A.budget_for(t).__dict__.values())}
                                  for t in tasks()],
        "summary": summary, "sweep": sweep, "incr": incr.__version__,
        "python": sys.version.split()[0], "seconds": round(seconds, 1),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": "python -m benchmarks.feedback " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    out = Path(a.out) if a.out else HERE / ("results-quick.json" if a.quick else "results.json")
    out.write_text(json.dumps(result, indent=1) + "\n")
    plot = a.plot or (None if (a.quick or real) else str(ROOT / "docs" / "evaluation.svg"))
    if plot:
        from benchmarks.feedback.plot import svg
        Path(plot).write_text(svg(summary, scenarios, arm_names, label))
    print(f"{len(rows)} arm runs in {seconds:.1f} s; results in {out}" +
          (f"; plot in {plot}" if plot else ""))
    print(f"model: {label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
