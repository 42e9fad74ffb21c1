"""rt.state from one thread while another records verdicts (rt.ack): every call returns a
state or raises IncrError (the runtime is another thread's), never a RuntimeError from a
ledger changing under it (found by tests/chaos/test_chaos_threads.py, intermittently)."""

from __future__ import annotations

import sys
import threading
import time

import incr


def test_state_while_another_thread_records_verdicts():
    rt = incr.Runtime()

    @incr.validator(version="1")
    def many(c, t):
        for i in range(30):
            yield incr.ACK(f"c{i}")

    @incr.llm(validators=[many])
    def gen(t, *, previous=None, feedback=()):
        return "answer"

    with rt:
        gen("t")
    bad, stop = [], threading.Event()

    def reader():
        while not stop.is_set():
            try:
                rt.state(gen, "t")
            except incr.IncrError:
                pass
            except Exception as e:          # noqa: BLE001 -- what the test looks for
                bad.append(repr(e))
                return
            time.sleep(0)                   # let the writer in now and then

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        ts = [threading.Thread(target=reader) for _ in range(2)]
        for t in ts:
            t.start()
        acked = 0
        for i in range(2000):
            try:
                rt.ack(gen, "t", revision=1, case=f"k{i}")
                acked += 1
            except incr.IncrError:
                pass
    finally:
        stop.set()
        for t in ts:
            t.join()
        sys.setswitchinterval(old)
    assert bad == []
    assert acked > 0
    st = rt.state(gen, "t")
    assert sum(1 for k in st.checks if k[0] == "rt.ack") == acked
    rt._check()
