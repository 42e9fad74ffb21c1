"""The computation of crash_child.py, as plain functions: what every stored value must be."""

from __future__ import annotations

import hashlib

PARTS = 4


def part_value(i: int, j: int, salt: int) -> tuple:
    blob = hashlib.sha256(f"{i}/{j}/{salt}".encode()).digest() * (1 + (i * 7 + j) % 60)
    return (i, j, salt, blob)


def work_value(i: int, salt: int) -> tuple:
    parts = [part_value(i, j, salt) for j in range(PARTS)]
    h = hashlib.sha256(b"".join(p[3] for p in parts)).hexdigest()
    return (i, salt, [len(p[3]) for p in parts], h)
