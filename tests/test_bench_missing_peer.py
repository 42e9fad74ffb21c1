"""The benchmark runner without the [bench] extra: reaktiv's rows are skipped, said once.

Cheap: the plan is one tiny workload, the child runs and the recursion probe are replaced, and
reaktiv is made missing by a monkeypatched import check (whether or not it is installed)."""

from benchmarks import __main__ as bench
from benchmarks import workloads


def test_missing_reaktiv_is_said_once_and_its_rows_skipped(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "_available", lambda module: module != "reaktiv")
    wl = next(p.workload for p in workloads.plan(True) if p.workload.kind == "noop")
    monkeypatch.setattr(workloads, "plan", lambda quick: [
        workloads.Plan(wl, ("incr", "reaktiv")),
        workloads.Plan(wl, ("reaktiv", "reaktiv_effect"))])
    ran = []

    def child(cmd, timeout):
        ran.append(cmd[3])
        return {"status": "ok", "ok": True, "per_unit_s": 1e-6, "per_op_s": 1e-6,
                "digest": "d"}

    def probe(peer, *a):
        raise AssertionError(f"probed {peer} although it is not installed")

    monkeypatch.setattr(bench, "_child", child)
    monkeypatch.setattr(bench, "probe_limit", probe)
    monkeypatch.setattr(bench, "targets", lambda rows: [])
    monkeypatch.setattr(bench, "render_targets", lambda ts: "")
    assert bench.main(["--quick", "--out", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert ran == ["incr"]
    assert out.count("reaktiv is not installed: its rows (reaktiv, reaktiv_effect) are "
                     "skipped; pip install -e '.[bench]'") == 1
    assert "child exited" not in out and "works up to None" not in out
    assert "skipped" in out.split("reaktiv is not installed", 1)[1]
