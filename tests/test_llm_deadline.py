"""Budget(max_seconds) bounds a node including a call in flight: an async call is cancelled
at the deadline, a sync one is abandoned (its late result is never used), and the node ends
NotAccepted(reason="budget"). No time is asserted: a call that is not cut waits on an event
that is only set after the loop has ended, so the test would hang instead of passing."""

import asyncio
import threading

import pytest

import incr
from incr.errors import NotAccepted


def sync_node(release, calls):
    @incr.llm(budget=incr.Budget(max_seconds=0.3))
    def slow(i, *, previous=None, feedback=()):
        calls.append(i)
        release.wait(30)              # released only after the loop gave up on it
        return f"late {i}"

    return slow


def test_a_sync_call_in_flight_is_abandoned_at_the_deadline():
    release, calls = threading.Event(), []
    slow = sync_node(release, calls)
    rt = incr.Runtime(max_workers=1)
    with rt:
        with pytest.raises(NotAccepted) as e:
            slow(1)
    release.set()
    assert e.value.reason == "budget" and calls == [1]
    assert "deadline" in e.value.report
    st = rt.state(slow, 1)
    assert st.revision == 0 and st.candidate is None     # the late result is never used
    rt._check()


def test_calls_running_ahead_in_threads_are_abandoned_at_the_deadline():
    release, calls = threading.Event(), []
    slow = sync_node(release, calls)
    rt = incr.Runtime(max_workers=3)
    obs = [rt.observe(slow, i) for i in range(3)]
    with pytest.raises(NotAccepted):
        rt.stabilize()
    release.set()
    assert sorted(calls) == [0, 1, 2]
    assert all(o.error is not None and o.error.reason == "budget" for o in obs)
    assert all(rt.state(slow, i).revision == 0 for i in range(3))
    rt._check()


def test_an_async_call_in_flight_is_cancelled_at_the_deadline():
    cancelled = []

    @incr.llm(budget=incr.Budget(max_seconds=0.3))
    async def slow(i, *, previous=None, feedback=()):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(i)
            raise
        return "late"

    @incr.cell
    async def both():
        return await asyncio.gather(slow(1), slow(2), return_exceptions=True)

    async def main():
        rt = incr.Runtime()
        with rt:
            out = await asyncio.wait_for(both(), 20)
            assert all(isinstance(x, NotAccepted) and x.reason == "budget" for x in out)
            rt._check()

    asyncio.run(main())
    assert sorted(cancelled) == [1, 2]

    # from sync code too (incr's own loop)
    with incr.Runtime():
        with pytest.raises(NotAccepted, match="budget"):
            slow(3)
    assert 3 in cancelled
