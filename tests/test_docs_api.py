"""The contract's examples run: every ```python block of docs/api.md, each in a fresh process
with a temporary working directory, must exit with status 0. A block that is a fragment (a
signature, a sketch with undefined names) is marked with ``<!-- not run -->`` on the line
before its fence. Also: the links of the README and docs/ point at files in the repository."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import incr

ROOT = Path(__file__).resolve().parent.parent
API = ROOT / "docs" / "api.md"
NOT_RUN = "<!-- not run -->"
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(text: str) -> list[tuple[int, str, bool]]:
    """(line number, code, runs) for every ```python block of ``text``: ``runs`` is False when
    the nearest non-blank line before the fence is ``<!-- not run -->``."""
    out = []
    for m in FENCE.finditer(text):
        before = text[:m.start()].rstrip("\n").splitlines()
        marker = next((line.strip() for line in reversed(before) if line.strip()), "")
        out.append((text.count("\n", 0, m.start()) + 1, m.group(1), marker != NOT_RUN))
    return out


BLOCKS = python_blocks(API.read_text(encoding="utf-8"))
RUNNABLE = [(line, code) for line, code, runs in BLOCKS if runs]


def test_the_contract_has_examples_that_run():
    assert len(RUNNABLE) >= 6
    assert len(BLOCKS) > len(RUNNABLE), "signature fragments are marked <!-- not run -->"


@pytest.mark.parametrize("line,code", RUNNABLE, ids=[f"api.md:{line}" for line, _ in RUNNABLE])
def test_api_example_runs(line, code, tmp_path):
    script = tmp_path / f"api_md_{line}.py"
    script.write_text(code, encoding="utf-8")
    env = dict(os.environ)
    # the incr this test imported (a checkout's build, or the installed package)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(incr.__file__).resolve().parent.parent)]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (f"docs/api.md, the block at line {line}, exited with "
                                  f"{proc.returncode}:\n{proc.stdout}\n{proc.stderr}")


def test_python_blocks_parser():
    text = ("x\n```python\na = 1\n```\n\n<!-- not run -->\n```python\nf(\n```\n"
            "<!-- not run -->\n\n```sh\nls\n```\n```python\nb = 2\n```\n")
    assert python_blocks(text) == [(2, "a = 1\n", True), (7, "f(\n", False),
                                   (15, "b = 2\n", True)]


LINK = re.compile(r"\]\(([^)\s]+)\)")
OUTSIDE = re.compile(r"\b(API|MODEL|CONCURRENCY|STYLE)\.md\b|shared/")


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of ``markdown``."""
    text = re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("doc", [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))],
                         ids=lambda p: p.name)
def test_links_point_into_the_repository(doc):
    text = doc.read_text(encoding="utf-8")
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        name, _, anchor = target.partition("#")
        path = (doc.parent / name).resolve() if name else doc
        assert path.exists(), f"{doc.name} links to {target}, which is not in the repository"
        if anchor and path.suffix == ".md":
            assert anchor in anchors(path.read_text(encoding="utf-8")), \
                f"{doc.name} links to {target}: {path.name} has no such heading"
    found = OUTSIDE.search(text)
    assert found is None, f"{doc.name} names {found.group(0)}, which is not in the repository"
