"""Attacks a full disk, for real: a 2 MiB tmpfs is mounted for the test (it needs root, or
CAP_SYS_ADMIN; without it the test is skipped and says why). A child process
(tests/chaos/progs/fullfs_child.py) fills the disk before opening a store, or after committing
some values, leaving a random few KiB free, and goes on computing values of random sizes.

Opening or committing must raise ``incr.StoreError`` (never SIGBUS, never another exception);
every value returned equals from-scratch; values computed before the disk filled are still
returned; once space is freed, a new runtime works and reads only correct values from the
store.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from chaos_util import chaos, finish, spawn  # noqa: F401 - chaos is a fixture

pytestmark = pytest.mark.hang_limit(300)


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("cannot mount a tmpfs here: there is no `mount` command")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        why = (proc.stderr or proc.stdout).strip() or f"mount exited with {proc.returncode}"
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN; "
                    f"euid {os.geteuid()}): {why}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_full_disk_is_a_store_error(small_disk, chaos):
    problems = []
    for seed in chaos.rounds(2, 40, "processes"):
        res = finish(spawn("fullfs_child.py", small_disk, seed, 12), timeout=120)
        for k in ("rounds", "demands", "store_errors", "opened_on_full_disk", "open_refused",
                  "damaged_warnings"):
            chaos.count(k, res[k])
        chaos.count("wrong_values", len(res["wrong"]))
        chaos.count("other_errors", len(res["other_errors"]))
        if res["wrong"] or res["other_errors"] or res["damaged_warnings"]:
            problems.append({k: res[k] for k in ("wrong", "other_errors", "damaged_warnings")})
    assert problems == [], problems
    assert chaos.tally["store_errors"] + chaos.tally["open_refused"] > 0, \
        "the disk never filled: the test did not test a full disk"
