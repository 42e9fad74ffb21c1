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


def test_demo_shows_minimal_recomputation():
    out = subprocess.run([sys.executable, "-m", "incr.cli", "demo", "--json"],
                         capture_output=True, text=True, check=True).stdout
    steps = json.loads(out)["steps"]
    by = {s["step"].split(":")[0] + str(i): s for i, s in enumerate(steps)}
    first, apples, tax, same, coffee, apples2 = steps
    assert len(first["ran"]) == 8
    assert tax["ran"] == ["tax()", "total()"]
    assert same["ran"] == [] and same["revision"] == tax["revision"]
    assert coffee["revision"] == same["revision"] + 1, "a batch is one revision"
    assert "tier()" in apples2["cut_off"] and "discount()" not in apples2["ran"]
    assert apples2["total"] == round(apples2["total"], 2)
    assert by  # every step has a title


def test_demo_text_output():
    from io import StringIO

    from incr.cli import demo

    buf = StringIO()
    assert demo(out=buf) == 0
    text = buf.getvalue()
    assert "cut off: tier()" in text and "ran:     tax(), total()" in text
