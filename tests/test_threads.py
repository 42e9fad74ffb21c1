"""A runtime is used by one thread at a time: a second thread that calls into a runtime while
it computes gets a clear IncrError, not a corrupted trace."""

import threading

import pytest

import incr


def test_second_thread_is_refused_while_computing(rt, log):
    x = rt.input("x", 1)
    inside, release = threading.Event(), threading.Event()

    @incr.cell
    def slow():
        log("slow")
        inside.set()
        release.wait(10)
        return x.get()

    @incr.cell
    def quick():
        log("quick")
        return x.get() + 1

    result = {}

    def worker():
        with rt:
            result["slow"] = slow()

    t = threading.Thread(target=worker)
    t.start()
    assert inside.wait(10)
    try:
        with rt:
            with pytest.raises(incr.IncrError, match="another thread"):
                quick()
            x.set(2)             # not refused: the next revision, after the pass in flight
            assert x.peek() == 1
    finally:
        release.set()
        t.join(10)
    assert result == {"slow": 1}   # the pass in flight never saw x = 2
    assert x.get() == 2            # applied when it ended
    with rt:
        assert quick() == 3      # usable again once the other thread is done
    assert log.take() == ["slow", "quick"]


def test_each_thread_its_own_runtime():
    out = {}

    @incr.cell
    def double(k):
        return 2 * k

    def worker(i):
        r = incr.Runtime()
        with r:
            out[i] = [double(k) for k in range(100)]
        r._check()

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert out == {i: [2 * k for k in range(100)] for i in range(4)}
