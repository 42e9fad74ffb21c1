"""Store errors and life cycle: owner-only permissions for what incr creates; a path that cannot hold a store (read-only,
a file, an unknown format) is an incr.StoreError naming the path; a full disk is a StoreError
that leaves earlier commits intact and the runtime answering; a forked child can use its
parent's runtime; a closed runtime raises incr.IncrError.

Some of these need root (mounting a small or read-only tmpfs). The tests run as root in this
environment, where file permission bits do not stop writes, so a read-only file system stands in
for a read-only directory there.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import stat
import subprocess
import sys

import lmdb
import pytest

import incr
from test_store_reliability import _in_child
from incr.store import FORMAT, unpack_record

IS_ROOT = os.geteuid() == 0
_RAN = []   # what the cells made by _make_add and _make_inc ran


@pytest.fixture(autouse=True)
def _collect_dead_cells():
    gc.collect()


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def _mount_tmpfs(target, options):
    """Mount a tmpfs on ``target``; returns None, or why it could not be mounted."""
    try:
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"cannot run mount: {e}"
    if proc.returncode != 0:
        return f"mount -t tmpfs -o {options} failed ({proc.returncode}): {proc.stderr.strip()}"
    return None


def _umount(target):
    subprocess.run(["umount", "-l", str(target)], capture_output=True, timeout=30)


# --- permissions ----------------------------------------------------------------------------

@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_new_store_is_owner_only(tmp_path, umask):
    path = tmp_path / "a" / "b" / "store"
    old = os.umask(umask)
    try:
        rt = incr.Runtime(store=path)
    finally:
        os.umask(old)
    try:
        x = rt.input("x", 2)

        @incr.cell
        def sq():
            return x.get() ** 2

        with rt:
            assert sq() == 4
    finally:
        rt.close()
    assert _mode(path) == 0o700
    files = sorted(os.listdir(path))
    assert "data.mdb" in files and "lock.mdb" in files
    for f in files:
        assert _mode(path / f) == 0o600, (f, oct(_mode(path / f)))


def test_existing_directory_keeps_its_mode(tmp_path):
    # incr makes owner-only only a directory it creates; one the user made keeps its mode
    path = tmp_path / "store"
    path.mkdir()
    os.chmod(path, 0o755)
    incr.Runtime(store=path).close()
    assert _mode(path) == 0o755
    for f in os.listdir(path):
        assert _mode(path / f) == 0o600


# --- paths that cannot hold a store ---------------------------------------------------------

def _assert_store_error(path, excinfo):
    assert isinstance(excinfo.value, incr.IncrError)
    assert str(os.path.abspath(path)) in str(excinfo.value), str(excinfo.value)


@contextlib.contextmanager
def _read_only_dir(tmp_path):
    """A directory this process cannot write in, holding an existing store ("existing").

    Yields (directory, existing store path or None, how). Not root: chmod 0500. Root ignores
    permission bits, so there: a tmpfs remounted read-only (EROFS stops root too); if mounting
    is not allowed, a directory of /proc, where nothing can be created (then there is no
    existing store to reopen, and None is yielded for it)."""
    if not IS_ROOT:
        d = tmp_path / "ro"
        d.mkdir()
        incr.Runtime(store=d / "existing").close()
        os.chmod(d / "existing", 0o500)
        os.chmod(d, 0o500)
        try:
            yield d, d / "existing", "chmod 0500"
        finally:
            os.chmod(d, 0o700)
            os.chmod(d / "existing", 0o700)
        return
    d = tmp_path / "ro"
    d.mkdir()
    why = _mount_tmpfs(d, "size=4m")
    if why is None:
        try:
            incr.Runtime(store=d / "existing").close()
            proc = subprocess.run(["mount", "-o", "remount,ro", str(d)], capture_output=True,
                                  text=True, timeout=30)
            assert proc.returncode == 0, proc.stderr
            yield d, d / "existing", "read-only tmpfs"
        finally:
            _umount(d)
        return
    # no mount: /proc/self/fdinfo is a directory in which nothing can be created
    yield os.path.realpath("/proc/self/fdinfo"), None, "/proc"


def test_read_only_location_is_a_store_error(tmp_path):
    with _read_only_dir(tmp_path) as (d, existing, how):
        new = os.path.join(d, "new-store")
        with pytest.raises(incr.StoreError) as excinfo:
            incr.Runtime(store=new)
        _assert_store_error(new, excinfo)
        assert not os.path.exists(new)
        if existing is not None:
            with pytest.raises(incr.StoreError) as excinfo:
                incr.Runtime(store=existing)
            _assert_store_error(existing, excinfo)


def test_file_in_place_of_the_directory(tmp_path):
    path = tmp_path / "store"
    path.write_bytes(b"not a directory")
    with pytest.raises(incr.StoreError) as excinfo:
        incr.Runtime(store=path)
    _assert_store_error(path, excinfo)
    assert path.read_bytes() == b"not a directory"   # left alone

    under = path / "sub"                               # a file as a parent directory
    with pytest.raises(incr.StoreError) as excinfo:
        incr.Runtime(store=under)
    _assert_store_error(under, excinfo)


@pytest.mark.parametrize("fmt", [b"999", b"0", b"1", b"garbage"])
def test_unknown_format_is_a_store_error(tmp_path, fmt):
    # b"1": a store written by the incr before record format 2 is refused, never misread
    path = tmp_path / "store"
    rt = incr.Runtime(store=path)
    rt.close()
    env = lmdb.open(str(path), max_dbs=4)
    try:
        meta = env.open_db(b"meta")
        with env.begin(write=True, db=meta) as txn:
            assert txn.get(b"format") == str(FORMAT).encode()
            txn.put(b"format", fmt)
    finally:
        env.close()
    with pytest.raises(incr.StoreError) as excinfo:
        incr.Runtime(store=path)
    _assert_store_error(path, excinfo)
    assert fmt.decode() in str(excinfo.value)
    # and nothing was changed by the refusal
    env = lmdb.open(str(path), max_dbs=4)
    try:
        with env.begin(db=env.open_db(b"meta")) as txn:
            assert txn.get(b"format") == fmt
    finally:
        env.close()


# --- a full disk ----------------------------------------------------------------------------

LIST_STORE = r"""
import json, os, sys, lmdb
from incr.store import unpack_record
from incr.keys import decode
env = lmdb.open(sys.argv[1], max_dbs=4, readonly=True, lock=False)
out = {}
with env.begin(db=env.open_db(b"entries", create=False)) as txn:
    for k, v in txn.cursor():
        rec = unpack_record(v)
        val = decode(rec["val"])
        out[rec["label"]] = [len(val), val[:1].hex()]
env.close()
print(json.dumps(out))
"""


def _list_store(path):
    """label -> [len, first byte] of every record, each checked with unpack_record; read in
    another process (LMDB must not be opened twice in one process)."""
    proc = subprocess.run([sys.executable, "-c", LIST_STORE, str(path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.hang_limit(120)
def test_full_disk(tmp_path, log):
    if not IS_ROOT:
        pytest.skip("a full disk needs a small tmpfs, and mounting one needs root "
                    f"(running as uid {os.geteuid()})")
    mnt = tmp_path / "small"
    mnt.mkdir()
    why = _mount_tmpfs(mnt, "size=2m")
    if why is not None:
        pytest.skip(f"cannot mount a 2 MiB tmpfs to fill: {why}")
    try:
        path = mnt / "store"
        # "sync": every demand that returned is committed (with "group" an error drops the
        # interval's results, which test_store_group covers)
        rt = incr.Runtime(store=path, durability="sync")

        @incr.cell
        def blob(i):
            log(f"blob({i})")
            return bytes([i % 256]) * 100_000

        committed = []
        error = None
        with rt:
            for i in range(200):
                try:
                    assert blob(i) == bytes([i % 256]) * 100_000
                except incr.StoreError as e:
                    error = e
                    break
                committed.append(i)
        assert error is not None, "2 MiB never filled up"
        assert str(path) in str(error)
        failed = i
        assert len(committed) >= 3
        log.take()

        # the runtime still answers: everything computed, the failed one included, is in memory
        with rt:
            for j in committed + [failed]:
                assert blob(j) == bytes([j % 256]) * 100_000
        assert log.take() == []

        # earlier commits are intact: every record decodes, each committed blob is there
        stored = _list_store(path)
        for j in committed:
            assert stored.get(f"blob({j})") == [100_000, bytes([j % 256]).hex()], j

        # room again: the same runtime stores again
        proc = subprocess.run(["mount", "-o", "remount,size=64m", str(mnt)],
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
        with rt:
            assert blob(failed + 1) == bytes([(failed + 1) % 256]) * 100_000
        rt.close()
        stored = _list_store(path)
        assert f"blob({failed + 1})" in stored

        # and a new runtime takes the committed ones from the store
        log.take()
        rt2 = incr.Runtime(store=path)
        try:
            with rt2:
                for j in committed:
                    assert blob(j) == bytes([j % 256]) * 100_000
            assert log.take() == []
            assert rt2.stats()["store_hits"] == len(committed)
        finally:
            rt2.close()
    finally:
        _umount(mnt)


# --- fork -----------------------------------------------------------------------------------

def _make_add(inp):
    # the same code and closure (the input, by name) every time: the same identity
    @incr.cell
    def add(k):
        _RAN.append(f"add({k})")
        return inp.get() + k
    return add


@pytest.mark.parametrize("how", ["same runtime", "new runtime"])
def test_forked_child_uses_the_store(tmp_path, how):
    # "same runtime": the child keeps using the runtime it inherited (its store is reopened
    # after fork); "new runtime": the child opens its own runtime on the same path, as a
    # multiprocessing worker started with fork would
    _RAN.clear()
    path = tmp_path / "store"
    rt = incr.Runtime(store=path)
    try:
        add = _make_add(rt.input("x", 10))
        with rt:
            assert add(1) == 11
        _RAN.clear()

        def child():   # runs in the fork()ed child (tests/test_store_reliability.py)
            if how == "same runtime":
                with rt:
                    return {"add1": add(1), "add2": add(2), "ran": list(_RAN),
                            "hits": rt.stats()["store_hits"]}
            mine = incr.Runtime(store=path)
            add_mine = _make_add(mine.input("x", 10))
            with mine:
                out = {"add1": add_mine(1), "add2": add_mine(2), "ran": list(_RAN),
                       "hits": mine.stats()["store_hits"]}
            mine.close()
            return out

        child = _in_child(child)
        assert child.pop("warnings") == []
        if how == "same runtime":   # add(1) is in its memory; add(2) is computed and stored
            assert child == {"add1": 11, "add2": 12, "ran": ["add(2)"], "hits": 0}
        else:                       # add(1) from the store; add(2) computed and stored
            assert child == {"add1": 11, "add2": 12, "ran": ["add(2)"], "hits": 1}

        # the parent still works, and sees what the child committed
        with rt:
            assert add(3) == 13
            assert add(2) == 12
        assert _RAN == ["add(3)"]
        assert rt.stats()["store_hits"] == 1
    finally:
        rt.close()
    stored = _labels(path)
    assert stored == ["add(1)", "add(2)", "add(3)"]


def _labels(path):
    env = lmdb.open(str(path), max_dbs=4)
    try:
        with env.begin(db=env.open_db(b"entries", create=False)) as txn:
            return sorted(unpack_record(v)["label"] for _k, v in txn.cursor())
    finally:
        env.close()


# --- close ----------------------------------------------------------------------------------

def _make_inc(inp):
    # the same code and closure (the input, by name) every time: the same identity
    @incr.cell
    def inc(k):
        _RAN.append(f"inc({k})")
        return inp.get() + k
    return inc


def test_closed_runtime_raises_incr_error(tmp_path):
    _RAN.clear()
    path = tmp_path / "store"
    rt = incr.Runtime(store=path)
    x = rt.input("x", 1)
    inc = _make_inc(x)
    with rt:
        assert inc(1) == 2
        rt.close()      # while it is the active runtime: cells called now run on it
        rt.close()      # idempotent
        for what, use in {"demand a computed instance": lambda: inc(1),
                          "demand a new instance": lambda: inc(2)}.items():
            with pytest.raises(incr.IncrError):
                use()

    uses = {
        "declare an input": lambda: rt.input("y", 1),
        "set an input": lambda: x.set(5),
        "enter": lambda: rt.__enter__(),
        "batch": lambda: rt.batch(),
        "stabilize": lambda: rt.stabilize(),
        "observe": lambda: rt.observe(inc, 1),
        "explain": lambda: rt.explain(inc, 1),
    }
    for what, use in uses.items():
        try:
            use()
        except incr.IncrError:
            continue
        pytest.fail(f"{what} on a closed runtime did not raise IncrError")
    assert _RAN == ["inc(1)"]

    # close flushed: a new runtime on the path takes inc(1) from the store
    rt2 = incr.Runtime(store=path)
    try:
        inc2 = _make_inc(rt2.input("x", 1))
        with rt2:
            assert inc2(1) == 2
            assert inc2(5) == 6
        assert _RAN == ["inc(1)", "inc(5)"]
        assert rt2.stats()["store_hits"] == 1
    finally:
        rt2.close()
