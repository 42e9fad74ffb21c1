"""Group commit (``Runtime(durability="group")``, the default): top-level demands are committed
together, once per interval (or GROUP_RECORDS records), and at close(), exit, fork and when a
dropped Runtime is collected; ``durability="sync"`` commits every top-level demand.

What another process sees is counted by a child process (LMDB is opened once per process).
A crash (SIGKILL at random points of a group-committing writer) loses at most what was not
yet committed: the store stays sound, every stored value is right, and everything the writer
had made durable (``rt._commit()``) is there. No test asserts a time: the commit thread is
waited for with a generous deadline, and the kill points are counted in lines of output."""

from __future__ import annotations

import gc
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import incr
import incr.store as store_mod
from store_progs.crash_model import work_value
from test_store_crash import PROGS, _check_store

GROUP_CHILD = os.path.join(PROGS, "group_child.py")

COUNT = textwrap.dedent("""
    import sys
    from incr.store import Store
    s = Store(sys.argv[1], count_run=False, create=False)
    print(sum(1 for _ in s.iter_records()))
    s.close()
""")


def stored_count(path) -> int:
    """Entries another process sees in the store at ``path``."""
    out = subprocess.run([sys.executable, "-c", COUNT, os.fspath(path)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


def _cells(rt):
    x = rt.input("x", 3)

    @incr.cell(version="1")
    def leaf(i):
        return x.get() * 1000 + i

    return x, leaf


@pytest.fixture
def slow_interval(monkeypatch):
    """Group commit whose interval never ends within a test: only close/exit/fork commit."""
    monkeypatch.setattr(store_mod, "GROUP_INTERVAL", 3600.0)
    monkeypatch.setattr(store_mod, "GROUP_RECORDS", 10 ** 9)


def test_durability_argument_is_checked(tmp_path):
    with pytest.raises(ValueError, match="durability must be 'group' or 'sync'"):
        incr.Runtime(store=tmp_path / "s", durability="fast")
    with pytest.raises(ValueError, match="durability"):
        incr.Runtime(durability=None)
    assert not (tmp_path / "s").exists()


def test_group_commits_top_level_demands_together_and_at_close(tmp_path, slow_interval):
    path = tmp_path / "s"
    rt = incr.Runtime(store=path)          # "group" is the default
    _x, leaf = _cells(rt)
    with rt:
        for i in range(50):
            assert leaf(i) == 3000 + i
    assert stored_count(path) == 0         # all 50 wait for one commit
    rt.close()
    assert stored_count(path) == 50
    rt = incr.Runtime(store=path)
    _x, leaf = _cells(rt)
    with rt:
        assert [leaf(i) for i in range(50)] == [3000 + i for i in range(50)]
    assert rt.stats()["store_hits"] == 50 and rt.stats()["computed"] == 0
    rt.close()


def test_sync_commits_every_top_level_demand(tmp_path, slow_interval):
    path = tmp_path / "s"
    rt = incr.Runtime(store=path, durability="sync")
    _x, leaf = _cells(rt)
    with rt:
        leaf(1)
        assert stored_count(path) == 1
        leaf(2)
        assert stored_count(path) == 2
    rt.close()


def test_group_commits_after_the_interval_without_close(tmp_path, monkeypatch):
    monkeypatch.setattr(store_mod, "GROUP_INTERVAL", 0.05)
    path = tmp_path / "s"
    rt = incr.Runtime(store=path)
    _x, leaf = _cells(rt)
    with rt:
        for i in range(20):
            leaf(i)
    # then the program does something else: the commit thread writes them
    deadline = time.monotonic() + 60
    while stored_count(path) < 20:
        assert time.monotonic() < deadline, "the interval's results were never committed"
        time.sleep(0.2)
    rt.close()


def test_group_commits_when_records_pile_up(tmp_path, monkeypatch):
    monkeypatch.setattr(store_mod, "GROUP_INTERVAL", 3600.0)
    monkeypatch.setattr(store_mod, "GROUP_RECORDS", 10)
    path = tmp_path / "s"
    rt = incr.Runtime(store=path)
    _x, leaf = _cells(rt)
    with rt:
        for i in range(25):
            leaf(i)
    assert stored_count(path) == 20        # two groups of 10; 5 wait
    rt.close()
    assert stored_count(path) == 25


PROGRAM = textwrap.dedent("""
    import os, sys
    import incr, incr.store
    incr.store.GROUP_INTERVAL = 3600.0
    rt = incr.Runtime(store=sys.argv[1])
    x = rt.input("x", 3)

    @incr.cell(version="1")
    def leaf(i):
        return x.get() * 1000 + i

    with rt:
        for i in range(30):
            leaf(i)
    if sys.argv[2] == "os._exit":
        os._exit(0)          # no atexit: what waited for its commit is lost
    if sys.argv[2] == "drop":
        del rt               # collected: its store commits
        import gc; gc.collect()
        print(len([o for o in gc.get_objects() if type(o).__name__ == "Store"]))
    # "exit": the interpreter ends without rt.close()
""")


@pytest.mark.parametrize("how", ["exit", "drop"])
def test_exit_or_a_dropped_runtime_commits(tmp_path, how):
    path = tmp_path / "s"
    out = subprocess.run([sys.executable, "-c", PROGRAM, str(path), how], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Warning" not in out.stderr, out.stderr
    assert stored_count(path) == 30


def test_os_exit_loses_the_interval_but_not_the_store(tmp_path):
    path = tmp_path / "s"
    out = subprocess.run([sys.executable, "-c", PROGRAM, str(path), "os._exit"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert stored_count(path) == 0         # lost: they were waiting for their commit
    rt = incr.Runtime(store=path)
    _x, leaf = _cells(rt)
    with rt:
        assert [leaf(i) for i in range(30)] == [3000 + i for i in range(30)]
    assert rt.stats()["computed"] == 30    # recomputed, never a wrong value
    rt.close()
    assert stored_count(path) == 30


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_fork_commits_what_the_parent_buffered(tmp_path, slow_interval):
    path = tmp_path / "s"
    rt = incr.Runtime(store=path)
    _x, leaf = _cells(rt)
    with rt:
        for i in range(20):
            leaf(i)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            rt.close()   # the parent's buffers are the parent's: nothing written twice
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert stored_count(path) == 20        # committed just before the fork
    with rt:
        leaf(20)
    rt.close()
    assert stored_count(path) == 21


def test_commit_thread_and_demands_interleave(tmp_path, monkeypatch):
    """A tiny interval: the commit thread commits (and ends parked passes) while the
    runtime's thread demands, hits and computes; nothing is lost, every value is right."""
    monkeypatch.setattr(store_mod, "GROUP_INTERVAL", 0.0005)
    path = tmp_path / "s"
    for round_ in range(2):
        rt = incr.Runtime(store=path)
        x, leaf = _cells(rt)
        with rt:
            for i in range(3000):
                assert leaf(i % 1500 + round_ * 1500) == 3000 + i % 1500 + round_ * 1500
        rt.close()
    assert stored_count(path) == 3000
    rt = incr.Runtime(store=path)
    x, leaf = _cells(rt)
    with rt:
        assert [leaf(i) for i in range(3000)] == [3000 + i for i in range(3000)]
    assert rt.stats()["computed"] == 0
    rt.close()


def test_a_background_commit_failure_is_raised_by_the_next_commit(tmp_path, monkeypatch):
    monkeypatch.setattr(store_mod, "GROUP_INTERVAL", 0.01)
    path = tmp_path / "s"
    rt = incr.Runtime(store=path)
    _x, leaf = _cells(rt)
    real = store_mod.Store._write
    calls = []

    def failing(self, env):
        calls.append(1)
        with self._buf_lock:
            self.pending, self.hit_tags = {}, bytearray()
        raise store_mod.StoreError(f"store {self.path}: the disk is full (test)")

    monkeypatch.setattr(store_mod.Store, "_write", failing)
    with rt:
        leaf(1)
    deadline = time.monotonic() + 60
    while not calls:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    monkeypatch.setattr(store_mod.Store, "_write", real)
    with pytest.raises(incr.StoreError, match="disk is full"):
        with rt:
            leaf(2)
    rt.close()


@pytest.mark.slow
@pytest.mark.hang_limit(300)
def test_sigkill_loop_group_commit(tmp_path):
    """SIGKILL a group-committing writer at seeded random points: the store is sound, every
    value right, everything the writer made durable is there, and a new process gets the
    from-scratch values."""
    rng = random.Random(1405)
    path = tmp_path / "s"
    durable: dict[int, set] = {}
    progressed = 0
    for _round in range(24):
        salt = rng.randrange(3)
        start = rng.randrange(0, 200)
        every = rng.choice([3, 7, 20])
        child = subprocess.Popen([sys.executable, GROUP_CHILD, str(path), str(salt), str(start),
                                  str(every)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, cwd=PROGS)
        try:
            assert child.stdout.readline() == "open\n", child.stderr.read()
            for _ in range(rng.choice([0, 1, 4, 10, 25, 40])):
                line = child.stdout.readline()
                assert line, child.stderr.read()
                progressed += 1
                if line.startswith("durable "):
                    durable.setdefault(salt, set()).update(range(start, int(line.split()[1]) + 1))
            time.sleep(rng.uniform(0, 0.06))   # where the kill lands; nothing waits on it
            child.send_signal(signal.SIGKILL)
            assert child.wait(timeout=30) == -signal.SIGKILL
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            child.stdout.close()
            child.stderr.close()
    assert progressed > 24 and durable
    stored = _check_store(path)                # sound, every stored value right
    for salt, idx in durable.items():
        assert idx <= stored.get(salt, set()), sorted(idx - stored.get(salt, set()))[:10]
    for salt in sorted(durable):
        have = sorted(stored[salt])[:30]
        out = subprocess.run([sys.executable, GROUP_CHILD, str(path), str(salt), "--verify",
                              *map(str, have + [5000])], capture_output=True, text=True,
                             timeout=120, cwd=PROGS)
        assert out.returncode == 0, out.stderr
        res = json.loads(out.stdout.strip().splitlines()[-1])
        for i in have + [5000]:
            assert res["values"][str(i)] == json.loads(json.dumps(work_value(i, salt)))
        assert res["ran"] == 1 + 4             # only work(5000) and its parts ran
