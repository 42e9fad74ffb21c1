"""Attacks docs/reliability.md's honesty: every test it names as holding a promise exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_test_named_in_the_reliability_doc_exists():
    text = (ROOT / "docs" / "reliability.md").read_text()
    named = re.findall(r"`((?:tests/)?[\w/]+\.py)::(\w+)(?:\[[\w-]+\])?`", text)
    assert len(named) >= 15
    missing = []
    for path, name in named:
        f = ROOT / path if path.startswith("tests/") else ROOT / "tests" / "chaos" / path
        if not f.exists() or not re.search(rf"^def {name}\(", f.read_text(), re.M):
            missing.append(f"{path}::{name}")
    assert missing == [], missing
    # and every chaos test is named there
    for f in sorted((ROOT / "tests" / "chaos").glob("test_chaos_*.py")):
        if f.name == Path(__file__).name:
            continue
        for name in re.findall(r"^def (test_\w+)\(", f.read_text(), re.M):
            assert f"{f.name}::{name}" in text, f"{f.name}::{name} is not in docs/reliability.md"
