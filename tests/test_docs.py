"""The examples people read must run: the package docstring, the README tour, the demo."""

import doctest
import json
import re
import subprocess
import sys
from pathlib import Path

import incr
import incr._core
import incr.keys

ROOT = Path(__file__).resolve().parent.parent


def test_docstring_examples_run():
    for mod in (incr, incr._core, incr.keys):
        failed, attempted = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
        assert failed == 0, mod.__name__
    assert doctest.testmod(incr)[1] >= 5, "the package docstring is the tour: it has examples"


def test_readme_tour_runs_and_recomputes_what_it_says():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## A 30-second tour\s+```python\n(.*?)```", text, re.S).group(1)
    ns: dict = {}
    exec(compile(block, "README.md", "exec"), ns)  # noqa: S102 - our own README's example
    rt, total = ns["rt"], ns["total"]
    with rt:
        assert total(0.2) == 48.0
    s = rt.stats()
    assert (s["computed"], s["recomputed"]) == (2, 2)
    assert "input 'qty' changed at revision 1" in rt.explain(ns["subtotal"])


def test_readme_commands_are_the_ones_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "incr demo" in readme.split("```")[1]
    assert "python -m pytest" in readme.split("```")[1] and "python -m pytest" in ci


def _demo_json(*args):
    out = subprocess.run([sys.executable, "-m", "incr.cli", "demo", "--json", *args],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def test_demo_shows_minimal_recomputation():
    steps = _demo_json("--sheet", "--memory")["steps"]
    first, apples, tax, same, coffee, apples2 = steps
    assert len(first["ran"]) == 8 and first["loaded"] == []
    assert tax["ran"] == ["tax()", "total()"]
    assert same["ran"] == [] and same["revision"] == tax["revision"]
    assert coffee["revision"] == same["revision"] + 1, "a batch is one revision"
    assert "tier()" in apples2["cut_off"] and "discount()" not in apples2["ran"]


def test_demo_second_process_recomputes_nothing(tmp_path):
    store = str(tmp_path / "demo-store")
    first = _demo_json("--sheet", "--store", store)
    assert first["functions_run"] > 8 and first["stats"]["store_hits"] == 0
    second = _demo_json("--sheet", "--store", store)
    assert second["functions_run"] == 0
    assert second["stats"]["computed"] == 0 and second["stats"]["recomputed"] == 0
    assert [s["total"] for s in second["steps"]] == [s["total"] for s in first["steps"]]
    assert len(second["steps"][0]["loaded"]) == 8


def test_demo_text_output(tmp_path):
    from io import StringIO

    from incr.cli import demo

    buf = StringIO()
    assert demo(store=None, out=buf) == 0
    text = buf.getvalue()
    assert "cut off: tier()" in text and "ran:     tax(), total()" in text
    store = str(tmp_path / "s")
    demo(store=store, out=StringIO())
    buf = StringIO()
    demo(store=store, out=buf)
    assert "This run computed nothing" in buf.getvalue()


def test_sql_demo_story(tmp_path):
    """incr demo: B forgets refunds, C's NACK carries the counterexample, only B generates
    again; a data change re-runs the query only; a new process calls the model 0 times."""
    store = str(tmp_path / "sql")
    first = _demo_json("--store", store)
    start, data = first["steps"]
    assert first["model"].startswith("scripted stand-in")
    assert start["generated"] == ["A", "B", "B (fed back: 1 NACK)",
                                  "B (fed back: 2 NACKs)"] and start["model_calls"] == 4
    nack, regression = start["nacks"]
    assert nack["revision"] == 1 and nack["case"] == "excludes_refunds"
    assert nack["counterexample"]["expected"] == 1 and nack["counterexample"]["got"] == 2
    # B's first fix drops the paid filter: a regression, reverted; the next is a patch of r1
    assert regression["revision"] == 2 and regression["case"] == "counts_paid"
    assert [a["outcome"] for a in start["attempts"]] == ["rejected", "reverted", "accepted"]
    assert start["attempts"][2]["patch"] and "+SELECT" in start["attempts"][2]["patch"]
    assert start["sql"] == ("SELECT COUNT(*) FROM orders WHERE status = 'paid' AND "
                            "refunded = 0") and start["sql_revision"] == 3
    assert start["answer"] == 2
    # one word for one thing: the per-step validator runs add up to the runtime's counter
    # (A's spec checked once, B's three candidates checked once each)
    assert start["validator_runs"] == 4 == first["stats"]["validations"]
    assert data["model_calls"] == 0 and data["validator_runs"] == 0 and data["query_ran"]
    assert data["answer"] == 3
    second = _demo_json("--store", store)
    assert second["model_calls"] == 0 and second["stats"]["generations"] == 0
    assert [s["answer"] for s in second["steps"]] == [2, 3]
    assert not any(s["query_ran"] for s in second["steps"])


def test_sql_demo_text(tmp_path):
    from io import StringIO

    from incr import demo_sql

    buf = StringIO()
    assert demo_sql.run(None, out=buf) == 0
    text = buf.getvalue()
    assert "scripted stand-in (not an LLM)" in text
    assert "only B was reopened by the NACK" in text and "answer = 3" in text
    assert "(a regression): reverted" in text and "is a minimal patch" in text
    store = str(tmp_path / "s")
    demo_sql.run(store, out=StringIO())
    buf = StringIO()
    demo_sql.run(store, out=buf)
    assert "This run called the model 0 times" in buf.getvalue()
    assert demo_sql.run(None, model_spec="bogus", out=StringIO()) == 2
