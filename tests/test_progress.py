"""incr.progress: bars on long passes, warm starts, `incr gc` and the benchmark runner.

The counts a pass reports are checked against what ran (counters in the cell bodies) and the
pass's own report; a bar is proven drawn by its text on the stream, never by a time: the long
pass is a cell that waits until the ticker has ticked during it."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
from collections import Counter

import pytest

import incr
from incr import progress
from incr.cli import main

RAN: Counter = Counter()


def _define(x, gate=None):
    @incr.cell(version="1")
    def leaf(i):
        RAN["leaf"] += 1
        if gate is not None and i == 0:
            assert gate.wait(30), "the ticker never ticked during the pass"
        return x.get() * i

    @incr.cell(version="1")
    def total(n):
        RAN["total"] += 1
        return sum(leaf(i) for i in range(n))

    return total


def test_the_callback_counts_what_the_pass_did_cold_and_warm(tmp_path):
    path = str(tmp_path / "s")
    seen = []
    rt = incr.Runtime(store=path)
    x = rt.input("x", 2)
    total = _define(x)
    progress.attach(rt, callback=seen.append, asked=False)
    with rt:
        obs = rt.observe(total, 50)
        RAN.clear()
        report = rt.stabilize()
        assert obs.value == 2 * sum(range(50))
    final = [c for c in seen if c.final]
    assert len(final) == 1
    assert final[0].ran == len(report.recomputed) == sum(RAN.values()) == 51
    assert final[0].loaded == len(report.loaded) == 0
    seen.clear()
    with rt:
        x.set(3)
        RAN.clear()
        report = rt.stabilize()
    (c,) = [c for c in seen if c.final]
    assert c.ran == len(report.recomputed) == sum(RAN.values()) == 51
    rt.close()

    # a warm start: a new runtime on the store takes the values, runs nothing
    seen.clear()
    rt = incr.Runtime(store=path)
    x = rt.input("x", 3)
    total = _define(x)
    progress.attach(rt, callback=seen.append, asked=False)
    with rt:
        obs = rt.observe(total, 50)
        RAN.clear()
        report = rt.stabilize()
        assert obs.value == 3 * sum(range(50))
    (c,) = [c for c in seen if c.final]
    assert sum(RAN.values()) == 0 and c.ran == len(report.recomputed) == 0
    assert c.loaded == len(report.loaded) >= 1
    rt.close()


def _long_pass(stream, asked, min_seconds=0.0, monkeypatch=None):
    """A pass that lasts until the ticker has ticked twice during it; the ticks seen."""
    gate = threading.Event()
    ticks = []

    def on_tick(c):
        if not c.final:
            ticks.append(c)
            if len(ticks) >= 2:
                gate.set()
    rt = incr.Runtime()
    x = rt.input("x", 1)
    total = _define(x, gate)
    detach = progress.attach(rt, file=stream, asked=asked, min_seconds=min_seconds,
                             callback=on_tick, interval=0.01)
    with rt:
        rt.observe(total, 3)
        rt.stabilize()
    detach()
    rt.close()
    return ticks


def test_a_long_pass_draws_a_bar_when_asked_and_nothing_otherwise(monkeypatch):
    monkeypatch.delenv("INCR_PROGRESS", raising=False)
    asked = io.StringIO()
    ticks = _long_pass(asked, asked=True)
    assert len(ticks) >= 2 and ticks[-1].ran <= 4
    assert "stabilizing revision" in asked.getvalue()

    quiet = io.StringIO()                # not a terminal, not asked: nothing printed
    assert len(_long_pass(quiet, asked=None)) >= 2
    assert quiet.getvalue() == ""

    monkeypatch.setenv("INCR_PROGRESS", "1")   # the environment asks
    env = io.StringIO()
    _long_pass(env, asked=None)
    assert "stabilizing revision" in env.getvalue()
    monkeypatch.setenv("INCR_PROGRESS", "0")
    off = io.StringIO()
    _long_pass(off, asked=None)
    assert off.getvalue() == ""


def test_without_rich_a_clear_error_only_when_a_bar_is_asked_for(monkeypatch):
    monkeypatch.delenv("INCR_PROGRESS", raising=False)
    monkeypatch.setitem(sys.modules, "rich.progress", None)
    rt = incr.Runtime()
    with pytest.raises(ImportError, match=r"pip install 'incr\[progress\]'"):
        progress.attach(rt, asked=True)
    with pytest.raises(ImportError, match=r"incr\[progress\]"):
        progress.bar("x", asked=True)
    progress.attach(rt, file=io.StringIO())                 # not asked: nothing, no error
    seen = []
    progress.attach(rt, callback=seen.append, asked=False)  # counting needs no rich
    with rt:
        rt.observe(_define(rt.input("x", 1)), 2)
        rt.stabilize()
    assert [c.ran for c in seen if c.final] == [3]
    rt.close()


def _store_with_garbage(path):
    """A store with 20 entries of which the latest run reaches 1 (the others: old versions)."""
    for v in range(3):
        rt = incr.Runtime(store=path)
        x = rt.input("x", v)

        @incr.cell(version=str(v))
        def sq(i):
            return x.get() * i * i

        @incr.cell(version=str(v))
        def top():
            return sum(sq(i) for i in range(6)) if v < 2 else 0
        with rt:
            rt.observe(top)
            rt.stabilize()
        rt.close()


def test_gc_reports_its_progress_and_draws_only_when_asked(tmp_path):
    from incr.store import Store, collect
    path = str(tmp_path / "s")
    _store_with_garbage(path)
    told = []
    st = Store(path)
    try:
        r = collect(st, keep_runs=1, dry_run=True, progress=lambda *a: told.append(a))
    finally:
        st.close()
    assert told[-1] == ("read", r["entries"], r["entries"]) and r["dropped"] > 0

    def gc(*flags):
        p = subprocess.run([sys.executable, "-m", "incr.cli", "gc", path, *flags],
                           capture_output=True, text=True, env={"PATH": "/usr/bin"},
                           cwd=str(_root()))
        assert p.returncode == 0, p.stderr
        return p
    p = gc("--dry-run")                           # stderr is a pipe: no bar
    assert p.stderr == "" and "would drop" in p.stdout
    p = gc("--progress")
    assert "gc: reading entries" in p.stderr and "gc: dropping" in p.stderr
    assert "dropped" in p.stdout
    assert f"of {r['dropped']} dropped" in p.stderr


def _root():
    from pathlib import Path
    return Path(incr.__file__).resolve().parent.parent


def test_gc_progress_without_rich_says_so_once_and_goes_on(tmp_path, monkeypatch, capsys):
    path = str(tmp_path / "s")
    _store_with_garbage(path)
    monkeypatch.setitem(sys.modules, "rich.progress", None)
    assert main(["gc", path, "--dry-run"]) == 0
    assert capsys.readouterr().err == ""           # not asked: not a word
    assert main(["gc", path, "--dry-run", "--progress"]) == 0
    cap = capsys.readouterr()
    assert cap.err.count("incr[progress]") == 1 and "going on without it" in cap.err
    assert "would drop" in cap.out


def test_bench_runner_bar_counts_the_rows(tmp_path, monkeypatch, capsys):
    from benchmarks import __main__ as bench
    from benchmarks import workloads
    wl = next(p.workload for p in workloads.plan(True) if p.workload.kind == "noop")
    monkeypatch.setattr(workloads, "plan", lambda quick: [
        workloads.Plan(wl, ("incr", "plain")), workloads.Plan(wl, ("incr",))])
    monkeypatch.setattr(bench, "_child", lambda cmd, timeout: {
        "status": "ok", "ok": True, "per_unit_s": 1e-6, "per_op_s": 1e-6, "digest": "d"})
    monkeypatch.setattr(bench, "probe_limit", lambda *a: {})
    monkeypatch.setattr(bench, "targets", lambda rows: [])
    monkeypatch.setattr(bench, "render_targets", lambda ts: "")
    monkeypatch.setattr(bench, "unavailable_peers", lambda: {})
    assert bench.main(["--quick", "--no-probe", "--out", str(tmp_path / "r.json"),
                       "--progress"]) == 0
    err = capsys.readouterr().err
    assert "benchmarks" in err and "3/3" in err
    assert bench.main(["--quick", "--no-probe", "--out", str(tmp_path / "r.json")]) == 0
    assert capsys.readouterr().err == ""          # captured stderr is no terminal
