"""An async cell's first step and the awaitable of ``await other(...)`` (compiled:
incr/_core_async.pxi): what they must keep of the Python path they replaced.

- a task spawned in a first step taken in sync code computes for that step's run (its reads
  are the run's dependencies), given by incr's own loop's task factory instead of the
  task-frames contextvar;
- what an async cell's call returns in async code is a coroutine by protocol: asyncio takes it
  (create_task, gather, wait_for), it can be awaited once, closed, or thrown into;
- a body that finishes in its first step is recorded as a sync run is (cutoff, failure, I6).
"""

from __future__ import annotations

import asyncio

import pytest

import incr


def _graph():
    rt = incr.Runtime()
    xs = [rt.input(f"x{i}", i) for i in range(3)]
    runs = {"top": 0, "atop": 0}

    @incr.cell
    def src(i):
        return xs[i].get() * 10

    @incr.cell
    async def asrc(i):
        return xs[i].get() * 100

    async def helper(i):
        # a plain coroutine, run as a task: the cells it calls are read for the run that
        # spawned it
        return src(i)

    async def ahelper(i):
        return await asrc(i)

    @incr.cell
    async def top():
        runs["top"] += 1
        a, b = await asyncio.gather(helper(1), helper(2))
        return a + b

    @incr.cell
    async def atop():
        runs["atop"] += 1
        t = asyncio.ensure_future(ahelper(0))
        return (await t) + (await asyncio.gather(ahelper(1)))[0]

    return rt, xs, runs, top, atop


@pytest.mark.parametrize("which", ["top", "atop"])
def test_a_task_spawned_in_a_first_step_in_sync_code_reads_for_its_run(which):
    rt, xs, runs, top, atop = _graph()
    cell = top if which == "top" else atop
    want = (lambda: xs[1].value * 10 + xs[2].value * 10) if which == "top" else \
        (lambda: xs[0].value * 100 + xs[1].value * 100)
    with rt:
        assert cell() == want()
        assert runs[which] == 1
        assert cell() == want()
        assert runs[which] == 1            # up to date: not run again
        changed = xs[2] if which == "top" else xs[0]   # read only inside a spawned task
        changed.set(changed.value + 5)
        assert cell() == want()
        assert runs[which] == 2            # the task's read is the run's dependency
        unread = xs[0] if which == "top" else xs[2]
        unread.set(unread.value + 5)
        assert cell() == want()
        assert runs[which] == 2            # and nothing else is
    rt._check()


def test_the_task_frames_of_a_first_step_do_not_outlive_it():
    """A task created on incr's own loop after the step (by incr itself, or by a later step)
    is not given the finished step's frames."""
    rt = incr.Runtime()
    x = rt.input("x", 1)
    runs = []

    @incr.cell
    def leaf():
        return x.get()

    @incr.cell
    async def quick():
        runs.append("quick")
        return 1

    @incr.cell
    async def later():
        runs.append("later")
        await asyncio.sleep(0)          # waits: goes on on incr's loop

        async def reader():
            return leaf()
        return await asyncio.ensure_future(reader())

    with rt:
        assert quick() == 1             # a first step that finishes
        assert later() == 1             # its task reads for `later`, not for `quick`
        x.set(2)
        assert quick() == 1
        assert later() == 2
    assert runs == ["quick", "later", "later"]
    rt._check()


def test_the_awaitable_of_an_async_cell_is_a_coroutine_to_asyncio():
    rt = incr.Runtime()
    x = rt.input("x", 2)

    @incr.cell
    async def sq():
        return x.get() ** 2

    @incr.cell
    async def uses():
        aw = sq()
        assert asyncio.iscoroutine(aw)
        t = asyncio.create_task(sq())
        a = await asyncio.wait_for(sq(), 5)
        return a + await t + await aw

    async def main():
        with rt:
            v = await uses()
            aw = sq.aget()
            first = await aw
            with pytest.raises(RuntimeError, match="already awaited"):
                await aw
            unused = sq()          # never awaited: closed, no warning, nothing recorded
            unused.close()
            thrown = sq()
            with pytest.raises(KeyError):
                thrown.throw(KeyError("k"))
            return v, first

    assert asyncio.run(main()) == (12, 4)
    rt._check()


def test_a_first_step_is_recorded_as_a_sync_run():
    rt = incr.Runtime()
    x = rt.input("x", 1)
    runs = {"parity": 0, "reader": 0, "bad": 0}

    @incr.cell
    async def parity():
        runs["parity"] += 1
        return x.get() % 2

    @incr.cell
    async def reader():
        runs["reader"] += 1
        return await parity() + 1

    @incr.cell
    async def bad():
        runs["bad"] += 1
        if x.get() > 2:
            raise ValueError("too big")
        return x.get()

    with rt:
        assert reader() == 2
        x.set(3)                        # parity unchanged: reader is not run (cutoff)
        assert reader() == 2
        assert runs == {"parity": 2, "reader": 1, "bad": 0}
        with pytest.raises(ValueError, match="too big"):
            bad()
        assert runs["bad"] == 1
    rt._check()
    with rt:
        x.set(2)
        assert bad() == 2
        assert runs["bad"] == 2
    rt._check()


def test_each_thread_takes_its_first_steps_on_its_own_loop():
    """The loop a first step runs on in sync code is cached (by thread state): a thread that
    takes one after another thread did gets its own loop, never the other's."""
    import threading

    from incr import _aio

    seen = {}
    turn = [threading.Event() for _ in range(4)]

    def worker(name, mine, then):
        rt = incr.Runtime()
        x = rt.input("x", 1)

        @incr.cell
        async def where():
            loop = asyncio.get_running_loop()
            await asyncio.gather(asyncio.sleep(0))   # a task, on that loop
            return x.get(), loop

        for k in (0, 1):
            turn[mine[k]].wait(10)
            with rt:
                x.set(k + 10)
                v, loop = where()
            seen.setdefault(name, []).append((v, loop is _aio._tl.loop, id(loop)))
            turn[then[k]].set()

    a = threading.Thread(target=worker, args=("a", (0, 2), (1, 3)))
    b = threading.Thread(target=worker, args=("b", (1, 3), (2, 3)))
    a.start()
    b.start()
    turn[0].set()
    a.join(30)
    b.join(30)
    assert [v for v, _, _ in seen["a"]] == [10, 11] and [v for v, _, _ in seen["b"]] == [10, 11]
    assert all(own for _, own, _ in seen["a"] + seen["b"])     # each on its thread's loop
    assert {i for _, _, i in seen["a"]}.isdisjoint({i for _, _, i in seen["b"]})


def _ctrl_c_in(fn_name, text):
    """A tracer raising KeyboardInterrupt once: on the line of ``fn_name`` that starts with
    ``text``, or as ``fn_name`` begins (text None)."""
    import linecache
    import sys
    fired = []

    def tracer(frame, event, arg):
        if fired or frame.f_code.co_name != fn_name:
            return tracer if not fired else None
        if (text is None and event == "call") or (
                text is not None and event == "line" and linecache.getline(
                    frame.f_code.co_filename, frame.f_lineno).strip().startswith(text)):
            fired.append(frame.f_lineno)
            sys.settrace(None)
            raise KeyboardInterrupt
        return tracer

    return tracer, fired


@pytest.mark.parametrize("drive,line", [
    (d, at) for d in ("demand", "stabilize", "astabilize")
    for at in (None,                              # as went_on begins (the core undoes it)
               "work = Resume(", "stack.pop()")
] + [("astabilize", "rt.inflight[n] = None"),        # async code: handed to a restart point
     ("astabilize", "rt.unwinding.append(work)"),
     ("demand", "drive(work.go(rt),")])             # sync code, no loop: went_on drives it
def test_ctrl_c_where_a_first_step_is_handed_on_leaves_the_runtime_usable(drive, line):
    import sys
    fn_name = "went_on"
    rt = incr.Runtime()
    x = rt.input("x", 1)
    runs = []

    @incr.cell
    async def leaf():
        runs.append(x.get())
        await asyncio.sleep(0)              # its first step waits
        return x.get() * 3

    @incr.cell
    def mid():
        return leaf() + 1

    o = rt.observe(mid)

    def go():
        if drive == "demand":
            with rt:
                return mid()
        if drive == "stabilize":
            rt.stabilize()
        else:
            asyncio.run(rt.astabilize())
        return o.value

    assert go() == 4
    x.set(2)
    tracer, fired = _ctrl_c_in(fn_name, line)
    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        with pytest.raises(KeyboardInterrupt):
            go()
    finally:
        sys.settrace(old)
    assert fired, f"{fn_name}: {line!r} never ran: the test no longer interrupts anything"
    rt._check()
    x.set(3)
    assert go() == 10
    assert runs[-1] == 3
    rt._check()
