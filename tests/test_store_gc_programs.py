"""``incr gc --keep-runs N`` keeps what the latest N runs *of each program* used: a program is
a command line (the main script and its arguments), so ``incr demo`` and ``incr demo --sheet``
(or one script run with two different subcommands) keep each other's results, and each
program's older runs are collected. ``--json`` says, per program, the runs kept and how many
entries they root."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROG = '''
import json, os, sys
import incr
store, which = sys.argv[1], sys.argv[2]
rt = incr.Runtime(store=store)
x = rt.input("x", int(os.environ.get("X", "1")))

@incr.cell(version="1")
def sql(i):
    return ("sql", i, x.get())

@incr.cell(version="1")
def sheet(i):
    return ("sheet", i, x.get())

with rt:
    vals = [(sql if which == "sql" else sheet)(i) for i in range(5)]
rt.close()
print(json.dumps(rt.stats()))
'''


def _run(tmp_path, store, which, x=1):
    script = tmp_path / "prog.py"
    script.write_text(PROG)
    out = subprocess.run([sys.executable, str(script), str(store), which], capture_output=True,
                         text=True, timeout=120, env=dict(os.environ, X=str(x)))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _gc(store, *args):
    out = subprocess.run([sys.executable, "-m", "incr.cli", "gc", str(store), *args],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_gc_keeps_the_latest_run_of_each_program(tmp_path):
    store = tmp_path / "store"
    assert _run(tmp_path, store, "sql", x=1)["computed"] == 5
    assert _run(tmp_path, store, "sheet")["computed"] == 5
    assert _run(tmp_path, store, "sql", x=2)["computed"] == 5      # sql's second run
    report = json.loads(_gc(store, "--keep-runs", "1", "--json"))
    # sql's first run (x=1) is collected; sheet's only run, older than sql's latest, is not
    assert (report["entries"], report["dropped"], report["kept"]) == (15, 5, 10), report
    progs = {tuple(json.loads(p["program"])[1:]): p for p in report["programs"]}
    assert set(progs) == {(str(store), "sql"), (str(store), "sheet")}, report["programs"]
    assert progs[(str(store), "sql")]["runs"] == [3]
    assert progs[(str(store), "sql")]["roots"] == 5
    assert progs[(str(store), "sheet")]["runs"] == [2]
    assert progs[(str(store), "sheet")]["roots"] == 5
    sheet = _run(tmp_path, store, "sheet")
    assert sheet["store_hits"] == 5 and sheet["computed"] == 0
    sql2 = _run(tmp_path, store, "sql", x=2)
    assert sql2["store_hits"] == 5 and sql2["computed"] == 0
    sql1 = _run(tmp_path, store, "sql", x=1)
    assert sql1["store_hits"] == 0 and sql1["computed"] == 5       # it was collected


def test_gc_text_report_names_each_program(tmp_path):
    store = tmp_path / "store"
    _run(tmp_path, store, "sql")
    _run(tmp_path, store, "sheet")
    text = _gc(store, "--keep-runs", "1", "--dry-run")
    assert "of each program" in text
    assert text.count("entries used") == 2 and '"sheet"' in text and '"sql"' in text, text


def test_a_long_command_line_is_still_a_program(tmp_path, monkeypatch):
    """A command line longer than an LMDB key (511 bytes) used to make opening the store
    fail (MDB_BAD_VALSIZE, e.g. pytest with many test files); it is recorded shortened, as
    JSON, with a hash of the whole, so two long command lines stay two programs."""
    import sys as _sys

    import incr

    from incr.store import Store
    for flag in ("a", "b"):
        monkeypatch.setattr(_sys, "argv", ["prog.py"] + [f"--{flag}-{i}" for i in range(200)])
        rt = incr.Runtime(store=tmp_path / "s")
        rt.close()
    s = Store(tmp_path / "s", count_run=False)
    try:
        names, runs, _ = s.programs_usage()
    finally:
        s.close()
    assert len(names) == 2 and len(set(runs.values())) == 2
    for name in names.values():
        assert len(name.encode()) <= 480
        words = json.loads(name)
        assert words[1] == "--a-0" or words[1] == "--b-0"
        assert "more" in words[-1]
