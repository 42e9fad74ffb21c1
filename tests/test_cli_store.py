"""The store commands: inspect, graph, gc — on a store written by a real run."""

import json
import re
import subprocess
import sys

import pytest

import incr
from incr.cli import main


def run_cli(*args):
    p = subprocess.run([sys.executable, "-m", "incr.cli", *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def define(x, strict=False):
    """The same two cells (same qualified names and version) for every process of a test;
    ``strict`` cells refuse to run, to prove values come from the store."""

    @incr.cell(version="1")
    def double(k):
        assert not strict, "must come from the store"
        return x.get() * 2 * k

    @incr.cell(version="1")
    def total():
        assert not strict, "must come from the store"
        return double(1) + double(2)

    return double, total


@pytest.fixture
def store(tmp_path):
    path = str(tmp_path / "store")
    rt = incr.Runtime(store=path)
    x = rt.input("x", 1)
    double, total = define(x)
    with rt:
        total()
        x.set(2)
        total()
    rt.close()
    return path


def test_inspect_lists_instances_and_traces(store, capsys):
    assert main(["inspect", store, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = {r["label"]: r for r in data["instances"]}
    assert set(rows) == {"total()", "double(1)", "double(2)"}
    assert all(r["traces"] == 2 for r in rows.values()), "x=1 and x=2 are two stored traces"
    assert all(r["bytes"] > 0 and r["damaged"] == 0 for r in rows.values())
    assert main(["inspect", store]) == 0
    text = capsys.readouterr().out
    assert "3 instances, 6 stored traces" in text and "double(2)" in text


def svg_x(store):
    """The x of each node's label centre in ``incr graph --format svg`` (Graphviz's layout)."""
    import io
    from incr.cli import graph_cmd
    buf = io.StringIO()
    assert graph_cmd(store, "svg", None, buf) == 0
    return {lab: float(x) for x, lab in re.findall(
        r'<g id="[^"]*" class="node[^"]*">\s*<(?:path|polygon)[^>]*/>\s*'
        r'<text[^>]*x="([\d.]+)"[^>]*>([^<]+)</text>', buf.getvalue())}


def test_graph_dot_html_json(store, tmp_path, capsys):
    assert main(["graph", store]) == 0
    dot = capsys.readouterr().out
    assert dot.startswith("digraph incr {") and dot.count("->") == 4  # x->double x2, double->total x2
    assert '"i78" [id="i78", class="kind-input", label="x", shape="box"' in dot  # i + name in hex
    out = tmp_path / "trace.html"
    assert main(["graph", store, "--format", "html", "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    page = out.read_text()
    assert page.startswith("<!doctype html>") and "<svg" in page and "total()" in page
    assert "http" not in re.sub(r'xmlns(:xlink)?=\\?"http://www.w3.org/[^"\\]*\\?"', "", page)
    # laid out in layers (by Graphviz): what is read stands left of what reads it
    xs = svg_x(store)
    assert xs["x"] < xs["double(1)"] == xs["double(2)"] < xs["total()"]
    assert main(["graph", store, "--json"]) == 0
    g = json.loads(capsys.readouterr().out)
    labels = {n["label"] for n in g["nodes"].values()}
    assert labels == {"x", "double(1)", "double(2)", "total()"}


def test_gc_keeps_what_the_latest_run_reaches(store, tmp_path):
    # a later run touches only the x=2 traces: the x=1 traces become unreachable
    rt = incr.Runtime(store=store)
    x = rt.input("x", 2)
    double, total = define(x, strict=True)
    with rt:
        assert total() == 12
    rt.close()
    code, out, _ = run_cli("gc", store, "--dry-run", "--json")
    assert code == 0 and json.loads(out) == {**json.loads(out), "dropped": 3, "kept": 3}
    code, out, _ = run_cli("gc", store, "--json")
    assert json.loads(out)["dropped"] == 3
    code, out, _ = run_cli("inspect", store, "--json")
    assert all(r["traces"] == 1 for r in json.loads(out)["instances"])
    # what gc kept still serves a new process
    rt = incr.Runtime(store=store)
    x = rt.input("x", 2)
    double, total = define(x, strict=True)
    with rt:
        assert total() == 12
    rt.close()


def test_gc_max_bytes_drops_least_recently_used(store):
    code, out, _ = run_cli("gc", store, "--keep-runs", "5", "--max-bytes", "1", "--json")
    assert code == 0 and json.loads(out)["kept"] == 0


def test_missing_store_is_a_clear_error(tmp_path):
    code, out, err = run_cli("inspect", str(tmp_path / "nope"))
    assert code == 1 and "no incr store at" in err and str(tmp_path / "nope") in err


def test_graph_html_layers_a_cell_reading_two_inputs(tmp_path):
    import re

    path = str(tmp_path / "s2")
    rt = incr.Runtime(store=path)
    a, b = rt.input("a", 1), rt.input("b", 2)

    @incr.cell(version="1")
    def both():
        return a.get() + b.get()

    @incr.cell(version="1")
    def twice():
        return both() * 2

    with rt:
        twice()
    rt.close()
    xs = svg_x(path)
    assert xs["a"] == xs["b"] < xs["both()"] < xs["twice()"]


def test_runtime_max_bytes_bounds_the_store_at_close(tmp_path):
    from incr.store import Store, instances

    path = str(tmp_path / "bounded")
    rt = incr.Runtime(store=path, max_bytes=20_000)
    x = rt.input("x", 1)

    @incr.cell(version="1")
    def blob(k):
        return bytes(500) + bytes([k % 256]) * x.get()

    with rt:
        for k in range(100):       # about 60 kB of records
            blob(k)
    rt.close()
    s = Store(path, count_run=False)
    try:
        rows = instances(s)
    finally:
        s.close()
    total = sum(r["bytes"] for r in rows)
    assert 0 < total <= 20_000 and 0 < len(rows) < 100
    # what was kept still serves a new process without running
    rt = incr.Runtime(store=path)
    x = rt.input("x", 1)
    kept = {r["label"] for r in rows}

    @incr.cell(version="1")
    def blob(k):  # noqa: F811 - the same cell, in "the next process"
        raise AssertionError("must come from the store")

    with rt:
        for label in kept:
            k = int(label[len("blob("):-1])
            assert blob(k) == bytes(500) + bytes([k % 256])
    rt.close()


def test_hit_counts_are_kept_through_the_usage_log_and_its_folding(tmp_path, monkeypatch):
    # hits are written as one log entry per commit and folded into per-entry usage later:
    # inspect reports the same counts before and after a fold, and gc still sees the last run
    from incr import store as store_mod
    from incr.store import Store, instances

    path = str(tmp_path / "s")

    def one_run(strict):
        rt = incr.Runtime(store=path)
        x = rt.input("x", 1)
        _double, total = define(x, strict=strict)
        with rt:
            assert total() == 6
        rt.close()

    def rows():
        s = Store(path, count_run=False, create=False)
        try:
            return {r["label"]: (r["hits"], r["last_run"]) for r in instances(s)}
        finally:
            s.close()

    one_run(False)                     # run 1 writes the three entries
    for _ in range(3):
        one_run(True)                  # runs 2-4 take them from the store
    want = {"total()": (3, 4), "double(1)": (3, 4), "double(2)": (3, 4)}
    assert rows() == want
    s = Store(path, count_run=False, create=False)
    try:
        s.fold()
        with s._begin() as txn:
            assert txn.stat(s.log)["entries"] == 0
    finally:
        s.close()
    assert rows() == want
    monkeypatch.setattr(store_mod, "FOLD_AT", 1)   # every commit folds
    one_run(True)
    assert rows() == {k: (4, 5) for k in want}
    code, out, _ = run_cli("gc", path, "--json")
    assert code == 0 and json.loads(out)["dropped"] == 0


@pytest.mark.parametrize("command", [["inspect"], ["inspect", "--json"], ["graph"],
                                     ["graph", "--format", "html"], ["gc"], ["gc", "--dry-run"],
                                     ["ui", "--port", "0"]])
def test_an_empty_directory_is_not_made_a_store(tmp_path, command):
    """issue 15: `incr inspect` on an empty directory created data.mdb. No command that reads
    a store creates one: each says there is none and leaves the directory as it was."""
    empty = tmp_path / "empty"
    empty.mkdir()
    code, out, err = run_cli(command[0], str(empty), *command[1:])
    assert code == 1 and "there is no incr store at" in err and str(empty) in err, err
    assert list(empty.iterdir()) == []
