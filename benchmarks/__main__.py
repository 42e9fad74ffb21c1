"""Run incr's benchmark suite: ``python -m benchmarks [--quick] [--only KIND[,KIND]]``.

Prints the versions, one table (workload, size, peer, time per op, time per unit, "vs. incr"),
the recursion limits found for the peers that recurse, and the project's performance targets
with the measured figure next to each; writes everything to benchmarks/results.json
(results-quick.json with --quick). Nothing here asserts a time: this is a measurement, not a
test. The method and its biases are in docs/performance.md.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from benchmarks import workloads
from benchmarks.peers import PEERS

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# the peers whose propagation recurses: the chain length at which they first fail is probed
PROBED = ("reaktiv", "reaktiv_effect")
# peers that need a package of the [bench] extra: without it their rows are skipped, said once
NEEDS = {"reaktiv": "reaktiv", "reaktiv_effect": "reaktiv"}


def _available(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def unavailable_peers() -> dict[str, str]:
    """peer -> the missing package it needs (``reaktiv`` without the ``[bench]`` extra)."""
    missing = {m for m in set(NEEDS.values()) if not _available(m)}
    return {peer: m for peer, m in NEEDS.items() if m in missing}


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def environment() -> dict:
    import incr
    import incr._core as core

    commit = _git("rev-parse", "--short", "HEAD")
    if _git("status", "--porcelain", "--", "incr"):
        commit += "+modified"
    built = Path(core.__file__).stat().st_mtime   # the engine's sources: _core.pyx, its parts
    stale = any(src.stat().st_mtime > built        # (.pxi), declarations and the codec
                for pat in ("_core*.p*", "_codec.p*") for src in (ROOT / "incr").glob(pat))
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "incr": incr.__version__,
        "incr_commit": commit,
        "incr_core": core.__file__,
        "incr_core_older_than_source": stale,
        "reaktiv": _version("reaktiv"),
        "cython": _version("Cython"),
        "platform": platform.platform(),
        "cpu": _cpu(),
        "cpus": os.cpu_count(),
        "recursion_limit": sys.getrecursionlimit(),
    }


def _child(args: list[str], timeout: float) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.harness", *args]
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "failed", "ok": False, "error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        return {"status": "failed", "ok": False,
                "error": f"child exited {p.returncode}: {' | '.join(tail)}"}
    return json.loads(lines[-1])


# -- formatting -------------------------------------------------------------------------------

def fmt_time(s: float | None) -> str:
    if s is None:
        return "—"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)):
        if s >= scale:
            v = s / scale
            return f"{v:.3g} {unit}" if v < 100 else f"{v:.0f} {unit}"
    return f"{s / 1e-9:.2f} ns"


def fmt_ratio(r: float | None) -> str:
    if r is None:
        return "—"
    return f"{r:.3g}×" if r < 100 else f"{r:.0f}×"


def _unit_short(unit: str) -> str:
    return {"recomputed cell": "cell", "recomputed node": "node"}.get(unit, unit)


def table_rows(rows: list[dict]) -> list[list[str]]:
    """Rows of the printed table; "vs. incr" is this peer's figure divided by incr's in the
    same workload and size (above 1: incr is faster or smaller)."""
    ref = {(r["workload"], r["size"]): r for r in rows
           if r["peer"] == "incr" and r.get("status") == "ok"}
    out = []
    for r in rows:
        key = (r["workload"], r["size"])
        mem = r["workload"] == "memory"
        if r.get("status") != "ok":
            note = r.get("error", r.get("status", "")).split(":")[0]   # the full text is in the JSON
            out.append([r["workload"], f"{r['size']:,}", r["peer"], "failed"
                        if r.get("status") == "failed" else "skipped", "", "", note[:70]])
            continue
        if mem:
            per_op = ""
            per_unit = f"{r['per_unit']:.0f} B/instance"
            ratio = r["per_unit"] / ref[key]["per_unit"] if key in ref else None
        else:
            per_op = fmt_time(r["per_op_s"])
            per_unit = f"{fmt_time(r['per_unit_s'])}/{_unit_short(r['unit'])}"
            ratio = r["per_op_s"] / ref[key]["per_op_s"] if key in ref else None
        note = "" if r.get("agrees", True) else "RESULT DIFFERS from incr's"
        out.append([r["workload"], f"{r['size']:,}", r["peer"], per_op, per_unit,
                    fmt_ratio(ratio), note])
    return out


HEADER = ["workload", "size", "peer", "time/op", "per unit", "vs. incr", "note"]


def render(rows: list[list[str]], markdown: bool = False) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(HEADER)]
    right = {1, 3, 4, 5}

    def line(cells):
        parts = [c.rjust(w) if i in right else c.ljust(w)
                 for i, (c, w) in enumerate(zip(cells, widths))]
        return ("| " + " | ".join(parts) + " |") if markdown else "  ".join(parts).rstrip()

    sep = ("|" + "|".join(("-" * (w + 1) + ":") if i in right else ("-" * (w + 2))
                          for i, w in enumerate(widths)) + "|") if markdown \
        else "  ".join("-" * w for w in widths)
    return "\n".join([line(HEADER), sep] + [line(r) for r in rows])


# -- targets ------------------------------------------------------------------------------------

def _get(rows, kind, size, peer):
    for r in rows:
        if (r["workload"], r["size"], r["peer"]) == (kind, size, peer) and r.get("status") == "ok":
            return r
    return None


def targets(rows: list[dict]) -> list[dict]:
    """The performance targets of the project, each with the measured figure (or None)."""
    out = []

    def add(name, goal, value, ok, detail):
        out.append({"target": name, "goal": goal, "measured": value,
                    "met": None if value is None else ok, "detail": detail})

    for n in (300, 100_000):
        inc, pl = _get(rows, "chain", n, "incr"), _get(rows, "chain", n, "plain")
        r = inc["per_unit_s"] / pl["per_unit_s"] if inc and pl else None
        add(f"chain[{n}]: incr per recomputed cell vs. plain call chain", "≤ 8×", r,
            r is not None and r <= 8,
            inc and pl and f"{fmt_time(inc['per_unit_s'])} vs. {fmt_time(pl['per_unit_s'])} per cell")
    inc, rk = _get(rows, "chain", 300, "incr"), _get(rows, "chain", 300, "reaktiv")
    r = rk["per_op_s"] / inc["per_op_s"] if inc and rk else None
    add("chain[300]: reaktiv time / incr time", "≥ 10×", r, r is not None and r >= 10,
        inc and rk and f"{fmt_time(rk['per_unit_s'])} vs. {fmt_time(inc['per_unit_s'])} per cell")
    for peer in ("incr", "incr_observe"):
        a, b = _get(rows, "tree", 1_000, peer), _get(rows, "tree", 100_000, peer)
        r = b["per_op_s"] / a["per_op_s"] if a and b else None
        add(f"tree: {peer} cost per change at 10^5 / at 10^3", "≤ 3×", r,
            r is not None and r <= 3,
            a and b and f"{fmt_time(b['per_op_s'])} vs. {fmt_time(a['per_op_s'])}")
        inc, pl = _get(rows, "tree", 100_000, peer), _get(rows, "tree", 100_000, "plain")
        r = pl["per_op_s"] / inc["per_op_s"] if inc and pl else None
        add(f"tree[10^5]: sum(xs) from scratch / {peer} per change", "≥ 50×", r,
            r is not None and r >= 50,
            inc and pl and f"{fmt_time(pl['per_op_s'])} vs. {fmt_time(inc['per_op_s'])}")
    inc = _get(rows, "noop", 1, "incr")
    v = inc["per_unit_s"] if inc else None
    add("noop: demand of an up-to-date instance", "≤ 1 µs", v, v is not None and v <= 1e-6,
        inc and fmt_time(v))
    inc = _get(rows, "memory", 1_000_000, "incr")
    v = inc["per_unit"] if inc else None
    add("memory[10^6]: engine bytes per instance", "≤ 400 B", v, v is not None and v <= 400,
        inc and f"{v:.0f} B")
    return out


def render_targets(ts: list[dict]) -> str:
    lines = []
    for t in ts:
        if t["met"]:
            verdict = "MET"
        else:
            verdict = "MISSED"
        m = t["measured"]
        if m is None:
            lines.append(f"  {'—':>8}  {t['target']}: goal {t['goal']}, not measured in this run")
            continue
        elif "bytes" in t["target"]:
            shown = f"{m:.0f} B"
        elif "demand" in t["target"]:
            shown = fmt_time(m)
        else:
            shown = f"{m:.3g}×"
        detail = f" ({t['detail']})" if t["detail"] else ""
        lines.append(f"  {verdict:>8}  {t['target']}: goal {t['goal']}, measured {shown}{detail}")
    return "\n".join(lines)


# -- recursion probe ---------------------------------------------------------------------------

def probe_limit(peer: str, kind: str, lo: int, hi: int, timeout: float) -> dict:
    """Largest size in [lo, hi) that works, by bisection over fresh processes (a peer that hit
    RecursionError may be left unusable, so each try gets its own)."""
    if not _child(["probe", peer, kind, str(lo)], timeout).get("ok"):
        return {"max_ok": None, "first_failure": lo}
    if _child(["probe", peer, kind, str(hi)], timeout).get("ok"):
        return {"max_ok": hi, "first_failure": None}
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _child(["probe", peer, kind, str(mid)], timeout).get("ok"):
            lo = mid
        else:
            hi = mid
    return {"max_ok": lo, "first_failure": hi}


# -- main ----------------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, short runs (smoke test)")
    ap.add_argument("--only", default="", help="comma-separated workload kinds: "
                    + ", ".join(workloads.KINDS))
    ap.add_argument("--peers", default="", help="comma-separated peers: " + ", ".join(PEERS))
    ap.add_argument("--no-probe", action="store_true", help="skip the recursion-limit probe")
    ap.add_argument("--out", default=None, help="where to write the JSON results")
    ap.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                    help="a progress bar on stderr, rows done of the plan (default: when "
                         "stderr is a terminal, or INCR_PROGRESS=1; needs rich)")
    args = ap.parse_args(argv)

    only = {k for k in args.only.split(",") if k}
    bad = only - set(workloads.KINDS)
    if bad:
        ap.error(f"unknown workload(s) {', '.join(sorted(bad))}; known: {', '.join(workloads.KINDS)}")
    peer_filter = {p for p in args.peers.split(",") if p}
    if peer_filter - set(PEERS):
        ap.error(f"unknown peer(s) {', '.join(sorted(peer_filter - set(PEERS)))}")
    out_path = Path(args.out) if args.out else HERE / ("results-quick.json" if args.quick
                                                       else "results.json")

    env = environment()
    print(f"incr {env['incr']} ({env['incr_commit']}), reaktiv {env['reaktiv']}, "
          f"Python {env['python']} ({env['implementation']}), Cython {env['cython']}")
    print(f"{env['platform']}, {env['cpu']}, {env['cpus']} CPUs; "
          f"load average {os.getloadavg()[0]:.2f}")
    if env["incr_core_older_than_source"]:
        print("WARNING: the engine's sources (incr/_core*.pyx/.pxi/.pxd, _codec) are newer than "
              "the compiled incr._core: rebuild first "
              "(pip install -e . --no-build-isolation), or these figures are of the old engine")
    if os.getloadavg()[0] > 0.5:
        print("WARNING: the machine is busy (load average above 0.5): figures will be noisy")
    print()

    unavailable = unavailable_peers()
    for pkg in sorted(set(unavailable.values())):
        peers = ", ".join(p for p, m in unavailable.items() if m == pkg)
        print(f"{pkg} is not installed: its rows ({peers}) are skipped; "
              f"pip install -e '.[bench]' to compare with it")
    if unavailable:
        print()

    timeout = 120 if args.quick else 600
    t_start = time.perf_counter()
    rows: list[dict] = []
    plan = [item for item in workloads.plan(args.quick)
            if not only or item.workload.kind in only]
    todo = sum(1 for item in plan for peer in item.peers
               if not peer_filter or peer in peer_filter)
    from incr import progress
    try:
        bar = progress.bar("benchmarks", todo, asked=args.progress, redirect=True)
    except ImportError as e:
        if args.progress:
            print(f"--progress: {e}; going on without it", file=sys.stderr)
        bar = progress.bar("benchmarks", todo, asked=False)
    done = 0
    for item in plan:
        wl = item.workload
        group = []
        for peer in item.peers:
            if peer_filter and peer not in peer_filter:
                continue
            bar.update(completed=done, detail=f"{wl.kind} {wl.size} {peer}")
            done += 1
            cmd = ["run", wl.kind, str(wl.size), peer] + (["quick"] if args.quick else [])
            if peer in unavailable:
                row = {"status": "skipped", "ok": False,
                       "error": f"{unavailable[peer]} is not installed"}
            else:
                row = _child(cmd, timeout)
            row.update(workload=wl.kind, size=wl.size, peer=peer)
            row.setdefault("unit", wl.unit)
            row.setdefault("units_per_op", wl.units_per_op)
            group.append(row)
        ref = next((r for r in group if r["peer"] == "incr" and r.get("status") == "ok"), None)
        for r in group:
            if ref is not None and r.get("status") == "ok" and r["peer"] != "incr":
                r["agrees"] = r.get("digest") == ref.get("digest")
        rows.extend(group)
        for line in render(table_rows(group)).splitlines()[2:]:
            print(line, flush=True)
    bar.update(completed=done, detail="")
    bar.close()

    probes = {}
    if not args.no_probe and (not only or "chain" in only):
        hi = 2_000
        for peer in PROBED:
            if (peer_filter and peer not in peer_filter) or peer in unavailable:
                continue
            probes[peer] = {"chain": probe_limit(peer, "chain", 50, hi, timeout)}

    elapsed = time.perf_counter() - t_start
    ts = targets(rows)
    print()
    print(render(table_rows(rows)))
    print()
    print("vs. incr: the peer's time (or bytes) divided by incr's for the same workload and "
          "size; above 1, incr is faster (smaller).")
    if probes:
        print()
        print(f"Recursion (Python's default limit, {env['recursion_limit']}):")
        for peer, by_kind in probes.items():
            for kind, p in by_kind.items():
                if p["first_failure"] is None:
                    print(f"  {peer}: {kind} works up to at least {p['max_ok']:,}")
                else:
                    print(f"  {peer}: {kind} works up to {p['max_ok']}, "
                          f"fails with RecursionError at {p['first_failure']}")
    print()
    print("Targets:")
    print(render_targets(ts))
    print()
    print(f"total {elapsed:.0f} s; load average {os.getloadavg()[0]:.2f}; results in "
          f"{out_path.relative_to(ROOT) if out_path.is_relative_to(ROOT) else out_path}")

    out_path.write_text(json.dumps({
        "mode": "quick" if args.quick else "full",
        "only": sorted(only),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "environment": env,
        "load_average_end": os.getloadavg()[0],
        "seconds": elapsed,
        "rows": rows,
        "recursion": probes,
        "targets": ts,
    }, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
