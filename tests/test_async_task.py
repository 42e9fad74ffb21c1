"""An async cell's body runs from its first step to its last as one task.

``asyncio.current_task()`` inside the body returns the same object at every step (its first,
taken by incr on the demander's stack, included), it is never the task that demanded the cell,
and cancelling it cancels only the body's run: asyncio.timeout, TaskGroup and anyio's cancel
scopes, which bind to ``current_task()`` when entered, then act on the body alone
(incr/_aio.py BodyTask). Each test is run under the three drivers: a plain call (incr's own
loop), ``await cell.aget()`` and ``await rt.astabilize()`` in a user's loop.
"""

import asyncio

import pytest

import incr

DRIVES = ["sync", "aget", "astabilize"]


def _demand(drive, cell, rt):
    """(value, the demanding task or None) of ``cell`` demanded by ``drive``."""
    if drive == "sync":
        with rt:
            return cell(), None

    async def main():
        with rt:
            me = asyncio.current_task()
            if drive == "aget":
                return await cell.aget(), me
            o = rt.observe(cell)
            await rt.astabilize()
            return o.value, me

    return asyncio.run(main())


@pytest.mark.parametrize("drive", DRIVES)
def test_current_task_is_one_object_at_every_step_and_never_the_demander(drive):
    rt = incr.Runtime()
    x = rt.input("x", 1)
    seen = {}

    @incr.cell
    async def leaf(i):
        t0 = asyncio.current_task()
        await asyncio.sleep(0.001 * i)
        t1 = asyncio.current_task()
        await asyncio.sleep(0)
        seen[("leaf", i)] = (t0, t1, asyncio.current_task())
        return x.get() + i

    @incr.cell
    async def quick():                       # finishes in its first step
        seen["quick"] = (asyncio.current_task(),)
        return 10

    @incr.cell
    async def top():
        t0 = asyncio.current_task()
        a, b = await asyncio.gather(leaf(1), leaf(2))
        t1 = asyncio.current_task()
        q = await quick()
        await asyncio.sleep(0.001)
        seen["top"] = (t0, t1, asyncio.current_task())
        return a + b + q

    value, me = _demand(drive, top, rt)
    assert value == 2 + 3 + 10
    assert set(seen) == {("leaf", 1), ("leaf", 2), "quick", "top"}
    tasks = {k: ts[0] for k, ts in seen.items()}
    for k, ts in seen.items():
        assert ts[0] is not None, k
        assert all(t is ts[0] for t in ts), (k, ts)       # one task from first step to last
        assert ts[0] is not me, k                         # never the demanding task
    assert len({id(t) for t in tasks.values()}) == 4      # each body a task of its own
    rt._check()


@pytest.mark.parametrize("drive", DRIVES)
def test_a_body_that_cancels_its_own_task_in_its_first_step_cancels_nothing_else(drive):
    """The cancel is asked for before the body has a real task: it is handed to that task
    and delivered at the body's next suspension, and the demander is not cancelled."""
    rt = incr.Runtime()
    runs = []

    @incr.cell
    async def selfish():
        runs.append(1)
        asyncio.current_task().cancel()
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            if hasattr(asyncio.Task, "uncancel"):          # (3.11+)
                assert asyncio.current_task().uncancel() == 0
            return "caught"
        return "not cancelled"

    value, _me = _demand(drive, selfish, rt)
    assert value == "caught" and runs == [1]
    rt._check()


@pytest.mark.skipif(not hasattr(asyncio, "timeout"), reason="asyncio.timeout is Python 3.11+")
@pytest.mark.parametrize("drive", DRIVES)
def test_asyncio_timeout_inside_a_body_expires_on_the_body_alone(drive):
    rt = incr.Runtime()
    x = rt.input("x", 1)
    runs = []

    @incr.cell
    async def slow():
        await asyncio.sleep(5)
        return 1

    @incr.cell
    async def bounded():
        runs.append(x.get())
        try:
            async with asyncio.timeout(0.02):
                return await slow()
        except TimeoutError:
            return -x.get()

    value, _me = _demand(drive, bounded, rt)
    assert value == -1 and runs == [1]
    rt._check()


def test_an_anyio_task_group_and_cancel_scope_inside_a_body_under_anyio_run():
    """The body's anyio scopes are entered and exited in one task (anyio compares
    current_task() identity), with anyio.run as the driver."""
    anyio = pytest.importorskip("anyio", reason="anyio is in the [test] extra")
    rt = incr.Runtime()
    xs = [rt.input(f"x{i}", i) for i in range(3)]
    runs = []

    @incr.cell
    async def part(i):
        runs.append(i)
        await anyio.sleep(0.001 * (i + 1))
        return xs[i].get() + 1

    @incr.cell
    async def whole():
        res = {}

        async def one(i):
            res[i] = await part(i)

        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(one, i)
        with anyio.move_on_after(0.01) as scope:
            await anyio.sleep(5)
        return sum(res.values()), scope.cancelled_caught

    async def main():
        with rt:
            return await whole.aget()

    assert anyio.run(main) == (1 + 2 + 3, True)
    assert sorted(runs) == [0, 1, 2]
    rt._check()


def test_a_body_task_that_someone_kept_is_never_handed_to_another_body():
    """A body that finished in its first step leaves its task to the next first step only if
    nobody kept it (incr/_core_async.pxi run_async, _spare_body): one kept by reference stays
    that body's, done; one kept by weak reference dies with it."""
    import weakref

    rt = incr.Runtime()
    seen, refs, runs = [], [], []

    @incr.cell
    async def holds(i):
        runs.append(("holds", i))
        seen.append(asyncio.current_task())
        return i

    @incr.cell
    async def weak(i):
        runs.append(("weak", i))
        refs.append(weakref.ref(asyncio.current_task()))
        return i

    @incr.cell
    async def plain(i):
        runs.append(("plain", i))
        return i

    with rt:
        for i in range(3):
            assert holds(i) == i and plain(i) == i and weak(i) == i
    assert sorted(runs) == sorted((k, i) for k in ("holds", "weak", "plain") for i in range(3))
    assert len({id(t) for t in seen}) == 3
    assert all(t.done() and not t.cancelled() for t in seen)
    assert [r() for r in refs] == [None, None, None]
    rt._check()
