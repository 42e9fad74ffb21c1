"""Docs that run: every ```python block of README.md and docs/*.md runs, in a fresh process
with a temporary working directory, and must exit with status 0 (docs/api.md's blocks are run
by tests/test_docs_api.py, with the same rules).

A block opts out only with a comment on the line before its fence that says why, for what a
test cannot have — a real model's key, a remote cluster — or for a fragment that is not a
program (a signature):

    <!-- not run: needs an OpenAI API key -->

A block that goes on from the one before it (the same story, step two) says so, and runs as
the blocks it continues followed by itself:

    <!-- continues -->
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import incr

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
MARKER = re.compile(r"^<!-- (not run(?::\s*(?P<why>.*?))?|continues) -->$")
DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md")
                                     if p.name != "api.md")]


def blocks(text: str) -> list[dict]:
    """Every ```python block of ``text``: its line, code, and what the marker before it says
    (``skip``: the reason, or "" for a bare ``<!-- not run -->``; ``continues``)."""
    out = []
    for m in FENCE.finditer(text):
        before = text[:m.start()].rstrip("\n").splitlines()
        last = next((ln.strip() for ln in reversed(before) if ln.strip()), "")
        mk = MARKER.match(last)
        out.append({"line": text.count("\n", 0, m.start()) + 1, "code": m.group(1),
                    "skip": (mk.group("why") or "") if mk and mk.group(1) != "continues"
                    else None,
                    "continues": bool(mk) and mk.group(1) == "continues"})
    return out


def programs() -> list:
    out = []
    for doc in DOCS:
        chain: list[str] = []
        for b in blocks(doc.read_text(encoding="utf-8")):
            if b["skip"] is not None:
                chain = []
                continue
            chain = chain + [b["code"]] if b["continues"] else [b["code"]]
            out.append(pytest.param(doc, b["line"], "\n".join(chain),
                                    id=f"{doc.name}:{b['line']}"))
    return out


def test_markers_parser():
    text = ("```python\na = 1\n```\n<!-- not run: needs a key -->\n```python\nf(\n```\n"
            "<!-- continues -->\n\n```python\nb = 2\n```\n<!-- not run -->\n```python\nc\n```\n")
    got = [(b["line"], b["code"], b["skip"], b["continues"]) for b in blocks(text)]
    assert got == [(1, "a = 1\n", None, False), (5, "f(\n", "needs a key", False),
                   (10, "b = 2\n", None, True), (14, "c\n", "", False)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_opt_out_says_why(doc):
    for b in blocks(doc.read_text(encoding="utf-8")):
        assert b["skip"] != "", (f"{doc.name}, the block at line {b['line']}: write why it is "
                                 f"not run, as <!-- not run: needs ... -->")


@pytest.mark.parametrize("doc,line,code", programs())
def test_doc_block_runs(doc, line, code, tmp_path):
    script = tmp_path / f"{doc.stem}_{line}.py"
    script.write_text(code, encoding="utf-8")
    env = dict(os.environ)
    # the incr this test imported (a checkout's build, or the installed package)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(incr.__file__).resolve().parent.parent)]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (f"{doc.relative_to(ROOT)}, the block at line {line}, exited "
                                  f"with {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
