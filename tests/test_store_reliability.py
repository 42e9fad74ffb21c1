"""The store under stress and misuse: another thread closing it mid-pass, a full file system,
fork(), odd paths, damaged LMDB pages, a forgotten runtime on the same path, and compaction.

Whatever can crash the interpreter (a segfault, a SIGBUS) runs in a child process, whose exit
status is checked: a crash fails the test instead of ending the test run. Mounting a small tmpfs
needs root; where it is not possible those tests skip, saying why, and a test with os.statvfs
patched to report a full disk covers the refusal anyway.
"""

from __future__ import annotations

import errno
import gc
import json
import os
import stat
import struct
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import lmdb
import pytest

import incr
from incr import store as store_mod
from incr.cli import main
from incr.store import DamagedRecordWarning, Store

_RAN: list[str] = []


@pytest.fixture(autouse=True)
def _collect_dead_runtimes():
    gc.collect()
    _RAN.clear()


def _child(code: str, *args, timeout=120):
    """Run ``code`` in a new interpreter; (return code, stdout, stderr)."""
    proc = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def _cli(*args):
    proc = subprocess.run([sys.executable, "-m", "incr.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def _mount_tmpfs(target, size):
    try:
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                               str(target)], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    if proc.returncode != 0:
        return proc.stderr.strip() or f"mount exited with {proc.returncode}"
    return None


def _umount(target):
    subprocess.run(["umount", "-l", str(target)], capture_output=True, timeout=30)


def _fill(directory):
    """Write a file in ``directory`` until the file system is full."""
    fd = os.open(os.path.join(directory, "filler"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\xff" * 4096)
    except OSError as e:
        assert e.errno in (errno.ENOSPC, errno.EDQUOT), e
    finally:
        os.close(fd)


def _make_add(inp):
    # the same code and closure (the input, by name) every time: the same identity
    @incr.cell
    def add(k):
        _RAN.append(f"add({k})")
        return inp.get() + k
    return add


# --- 10: a full file system ------------------------------------------------------------------

OPEN_STORE = r"""
import json, sys
import incr
try:
    rt = incr.Runtime(store=sys.argv[1])
except incr.StoreError as e:
    print(json.dumps({"error": str(e)}))
else:
    rt.close()
    print(json.dumps({"opened": True}))
"""


@pytest.mark.hang_limit(120)
def test_store_on_a_full_file_system_is_refused_before_lmdb_maps_it(tmp_path):
    mnt = tmp_path / "full"
    mnt.mkdir()
    why = _mount_tmpfs(mnt, "1m")
    if why is not None:
        pytest.skip(f"cannot mount a tmpfs: {why}")
    try:
        _fill(mnt)
        path = mnt / "store"
        code, out, err = _child(OPEN_STORE, path)
        assert code == 0, f"opening a store on a full file system killed the child ({code}; " \
                          f"-7 is SIGBUS)\n{err}"
        msg = json.loads(out)["error"]
        assert str(path) in msg and "free" in msg, msg
        assert not path.exists(), "nothing is created on a full file system"
    finally:
        _umount(mnt)


class _FullDisk:
    f_bsize = f_frsize = 4096
    f_blocks = 1000
    f_bfree = f_bavail = 3       # 12 KiB
    f_files = f_ffree = f_favail = 1000
    f_flag = 0
    f_namemax = 255


def test_store_is_refused_when_statvfs_reports_a_full_disk(tmp_path, monkeypatch):
    asked = []

    def statvfs(p):
        asked.append(p)
        return _FullDisk()

    monkeypatch.setattr(os, "statvfs", statvfs)
    for path in (tmp_path / "new" / "store", tmp_path):      # to create; existing, empty
        with pytest.raises(incr.StoreError) as excinfo:
            incr.Runtime(store=path)
        msg = str(excinfo.value)
        assert str(path) in msg and "12288 bytes free" in msg, msg
    assert asked
    assert not (tmp_path / "new").exists() and not (tmp_path / "data.mdb").exists()


@pytest.mark.hang_limit(120)
def test_full_disk_during_a_commit_says_the_disk_is_full(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    why = _mount_tmpfs(mnt, "2m")
    if why is not None:
        pytest.skip(f"cannot mount a tmpfs: {why}")
    try:
        path = mnt / "store"
        rt = incr.Runtime(store=path)

        @incr.cell
        def blob(i):
            return bytes([i % 256]) * 100_000

        error = None
        with rt:
            for i in range(100):
                try:
                    blob(i)
                except incr.StoreError as e:
                    error = e
                    break
        assert error is not None, "2 MiB never filled up"
        msg = str(error)
        assert str(path) in msg and "disk is full" in msg and "Free some space" in msg, msg
        with rt:                                   # still answers from memory
            assert blob(i) == bytes([i % 256]) * 100_000
        rt.close()
    finally:
        _umount(mnt)


def test_lmdb_errors_are_explained(tmp_path, monkeypatch):
    path = str(tmp_path / "store")
    eio = lmdb.Error("mdb_txn_commit: " + os.strerror(errno.EIO))
    # an I/O error on a disk with room is not called a full disk...
    msg = str(store_mod._explain(path, eio, "writing"))
    assert path in msg and "disk is full" not in msg and os.strerror(errno.EIO) in msg
    # ... on a full one it is
    monkeypatch.setattr(os, "statvfs", lambda p: _FullDisk())
    msg = str(store_mod._explain(path, eio, "writing"))
    assert path in msg and "disk is full" in msg and "Free some space" in msg, msg
    monkeypatch.undo()
    for e in (lmdb.DiskError("mdb_txn_commit: " + os.strerror(errno.ENOSPC)),
              OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))):
        msg = str(store_mod._explain(path, e, "writing"))
        assert "disk is full" in msg, msg
    msg = str(store_mod._explain(path, lmdb.MapFullError("mdb_put: MDB_MAP_FULL"), "writing"))
    assert "map is full" in msg and "incr gc" in msg, msg
    for e in (lmdb.CorruptedError("mdb_get: MDB_CORRUPTED"),
              lmdb.PageNotFoundError("mdb_cursor_get: MDB_PAGE_NOTFOUND")):
        msg = str(store_mod._explain(path, e, "reading"))
        assert "damaged" in msg and f"delete {path}" in msg, msg
