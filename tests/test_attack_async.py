"""Hostile tests of the concurrency / asyncio feature (attack11). Each test is one finding and
FAILS on the code it was written against; see the FINDING n comments."""

import asyncio
import subprocess
import sys
import textwrap
import threading
import os

import pytest

import incr
from incr.errors import IncrError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(coro):
    return asyncio.run(coro)


def _subprocess(code, timeout=30):
    """Run ``code`` in a fresh interpreter (a hang there is a finding, not a hung test run)."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    try:
        p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return "HANG", (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    return p.returncode, p.stdout + p.stderr


# FINDING 1 (wrong result / crash): a task that was never cancelled gets CancelledError.
# Task t1 awaits async cell a() and is cancelled; a task t2 that asks for a() right after joins
# the same in-flight work (single flight), but the work was cancelled when its last waiter
# (t1) left (incr/_aio.py do_works `entry[0].cancel()`, ~line 436), and _perform then cancels
# the shared future (`fut.cancel()`, ~line 451) that t2 waits on: t2 raises CancelledError.
def test_finding1_a_task_joining_work_whose_last_waiter_was_cancelled_gets_cancelled_error():
    async def main():
        rt = incr.Runtime()
        x = rt.input("x", 1)

        @incr.cell
        async def a():
            for _ in range(3):
                await asyncio.sleep(0)
            return x.get()

        with rt:
            t1 = asyncio.ensure_future(a())
            await asyncio.sleep(0)
            t1.cancel()
            await asyncio.sleep(0)
            t2 = asyncio.ensure_future(a())        # never cancelled
            r1, r2 = await asyncio.gather(t1, t2, return_exceptions=True)
            assert isinstance(r1, asyncio.CancelledError)
            assert r2 == 1, f"t2 was never cancelled but got {r2!r}"

    run(main())


# FINDING 2 (wrong value, then a permanently stuck instance): a cell that catches
# BaseException (or uses a bare `except:`) around a sync call of an async cell swallows the
# engine's internal _Suspend (incr/errors.py: _Suspend is a BaseException). The cell's fallback
# value is recorded as its value, and the async instance whose first step started
# (incr/_aio.py went_on: `rt.inflight[n] = None`) is never finished nor dropped: every later
# demand of it raises "in flight with nobody to finish it (an internal error)".
def test_finding2_a_broad_except_swallows_the_internal_suspend():
    async def main():
        rt = incr.Runtime()
        x = rt.input("x", 1)

        @incr.cell
        async def leaf():
            await asyncio.sleep(0.001)
            return x.get()

        @incr.cell
        def careful():
            try:
                return leaf()
            except BaseException:
                return -1

        with rt:
            v = await careful.aget()
            leaf_v = await asyncio.wait_for(leaf(), 3)
            rt._check()
            assert (v, leaf_v) == (1, 1)

    run(main())


# FINDING 3 (bad error): Input.set from another thread while the loop's thread runs a step of
# an async cell (a task step, outside a top-level demand, so busy_depth == 0) raises
# ReentrancyError ("computing in another thread") in the setting thread, instead of being
# queued as the next revision as the commit promises for a set during a pass.
# incr/_core.pyx set_input (~line 2419): other_busy() is false, then `if self.frames:` raises.
def test_finding3_input_set_from_another_thread_during_an_async_run_is_refused():
    import time
    rt = incr.Runtime()
    x = rt.input("x", 0)
    in_a = threading.Event()
    err = []

    @incr.cell
    def a():
        v = x.get()
        in_a.set()
        time.sleep(0.1)
        return v

    @incr.cell
    async def top():
        await asyncio.sleep(0.01)     # from here the body runs as a task
        return await a.aget()

    def setter():
        in_a.wait(5)
        try:
            x.set(1)
        except Exception as e:
            err.append(e)

    async def main():
        with rt:
            th = threading.Thread(target=setter)
            th.start()
            await top()
            th.join()
            return await top()

    v = run(main())
    assert err == [], f"the setting thread got {err!r}"
    assert v == 1 and x.peek() == 1


# FINDING 4 (crash, runtime bricked): the steps of an async run that go on in a task are not a
# "top-level demand" (no enter()), so another thread may claim the runtime between them; the
# loop's next step then swaps the running stack (rt._frames_swap) under that thread's run.
# Result: the other thread's cell reads land in the async cell's frame, the async cell gets a
# nonsense CycleError, a frame and a RUNNING flag are left behind, and every later demand on
# the runtime raises "computing in another thread" forever. Expected: the other thread gets
# IncrError (one thread at a time) and nothing is damaged.
def test_finding4_another_thread_demanding_between_async_steps_corrupts_the_runtime():
    import time
    rt = incr.Runtime()
    x = rt.input("x", 1)
    y = rt.input("y", 10)
    a_started, s_in, s_go, s_done = (threading.Event() for _ in range(4))
    out = {}

    @incr.cell
    def S():
        s_in.set()
        s_go.wait(5)
        return y.get()

    @incr.cell
    async def A():
        a_started.set()
        await asyncio.sleep(0.2)
        s_go.set()
        s_done.wait(2)
        return x.get()

    def t2():
        a_started.wait(5)
        try:
            with rt:
                out["S"] = S()
        except IncrError as e:
            out["S"] = e
        s_done.set()

    async def main():
        with rt:
            out["A"] = await asyncio.wait_for(A(), 5)

    th = threading.Thread(target=t2)
    th.start()
    try:
        run(main())
    finally:
        s_go.set()
        th.join()
    rt._check()
    with rt:
        assert A() == 1 and S() == 10


# FINDING 5 (hang): a KeyboardInterrupt (Ctrl-C) that lands in a sync observed cell while
# rt.stabilize() has already set aside async work for async observed cells leaves them marked
# running, with rt.inflight holding their entries (None, and a future nobody resolves: the work
# tasks were cancelled by drive() before they ever started, so _perform's `finally` never ran;
# and the Resume works collected in stabilize_pass's `suspended` list are never dropped). The
# next rt.stabilize() waits forever. (A real Ctrl-C timed early in stabilize() does the same.)
def test_finding5_keyboard_interrupt_in_a_pass_with_async_work_then_restabilize_hangs():
    code = """
        import asyncio
        import incr
        rt = incr.Runtime()
        interrupt = [True]

        @incr.cell
        async def leaf():
            await asyncio.sleep(0.01)
            return 1

        @incr.cell
        async def mid():
            return await leaf() + 1

        @incr.cell
        def syn():
            if interrupt[0]:
                interrupt[0] = False
                raise KeyboardInterrupt
            return 5

        o1 = rt.observe(mid)
        o2 = rt.observe(syn)
        try:
            rt.stabilize()
        except KeyboardInterrupt:
            pass
        rt.stabilize()
        rt._check()
        print("VALUES", o1.value, o2.value)
    """
    rc, out = _subprocess(code, timeout=20)
    assert rc == 0 and "VALUES 2 5" in out, (rc, out[-2000:])


# FINDING 6 (bad error): a sync cell that runs a coroutine with asyncio.run (a pattern the docs
# name: "a cell may run a coroutine to completion inside itself, for example with asyncio.run")
# and calls an async cell inside that loop: incr/_aio.py call() (~line 330) sees a sync frame on
# top and takes the sync path even though a loop is running, so the call either returns a plain
# value (`await leaf()` -> TypeError "object int can't be used in 'await' expression") or, when
# leaf must run, unwinds with _Suspend through the user's loop and the top-level *sync* demand
# fails with IncrError telling the caller to "await" (`leaf.aget()` in the same place works).
def test_finding6_calling_an_async_cell_inside_asyncio_run_inside_a_sync_cell():
    rt = incr.Runtime()
    x = rt.input("x", 1)

    @incr.cell
    async def leaf():
        await asyncio.sleep(0.001)
        return x.get() * 10

    @incr.cell
    def nested():
        async def inner():
            return await leaf() + 2       # async code, in a running loop: an awaitable
        return asyncio.run(inner())

    with rt:
        assert nested() == 12


# FINDING 7 (bad error): rt.inflight is shared by every event loop. While one thread's loop has
# an async run in flight (between two steps, the runtime is not claimed), another thread that
# asks for the same instance from its own loop joins the first loop's future and gets
# asyncio's RuntimeError "... got Future ... attached to a different loop" instead of IncrError
# (one thread at a time). The same happens in a fork()ed child (inherited rt.inflight).
# incr/_aio.py do_works (~line 410): `fut = rt.inflight.get(w.key)` is awaited whatever its loop.
def test_finding7_a_second_loop_joining_work_in_flight_on_another_loop():
    rt = incr.Runtime()
    started = threading.Event()
    release = threading.Event()
    out = {}

    @incr.cell
    async def slow():
        started.set()
        while not release.is_set():
            await asyncio.sleep(0.01)
        return 1

    def first():
        async def main():
            with rt:
                return await slow()
        out["first"] = asyncio.run(main())

    th = threading.Thread(target=first)
    th.start()
    started.wait(5)

    async def second():
        with rt:
            return await asyncio.wait_for(slow(), 5)
    try:
        try:
            out["second"] = asyncio.run(second())
        except BaseException as e:
            out["second"] = e
    finally:
        release.set()
        th.join()
    assert out["first"] == 1
    assert out["second"] == 1 or isinstance(out["second"], IncrError), repr(out["second"])


# FINDING 8 (wrong behaviour: the concurrency bound is not kept): the semaphores of
# Runtime(max_concurrency=) live in the module-global incr/_aio.py `_limits`, keyed by
# (id(rt), id(loop)) and never removed. A new runtime allocated at a dead runtime's address
# inherits the dead runtime's semaphore: Runtime(max_concurrency=1) then has 5 model calls in
# flight at once (and a Runtime(max_concurrency=5) may be held to 1). The map also grows by one
# semaphore (holding its loop) per runtime and loop.
def test_finding8_max_concurrency_is_taken_from_a_dead_runtime_at_the_same_address():
    import gc
    live, peak = [0], [0]

    @incr.llm(budget=incr.Budget(max_attempts=2))
    async def gen(i, *, previous=None, feedback=()):
        live[0] += 1
        peak[0] = max(peak[0], live[0])
        await asyncio.sleep(0.01)
        live[0] -= 1
        return f"{i}"

    async def main():
        out = []
        for k in [5] + [1] * 6:
            rt = incr.Runtime(max_concurrency=k)
            peak[0] = 0
            with rt:
                await asyncio.gather(*[gen.aget(i) for i in range(5)])
            out.append((k, peak[0]))
            del rt
            gc.collect()
        return out

    out = run(main())
    assert all(p <= k for k, p in out), out


# FINDING 9 (wrong value, stale forever): `with incr.untracked():` spanning an await. The
# runtime keeps ONE "quiet" frame id (incr/_core.pyx quiet_enter, ~line 1617, restored on exit)
# and restores it last-in-first-out, which tasks do not follow: f enters (quiet=f), g enters
# (saves f), f leaves (quiet=0), g leaves (restores quiet=f). f's later *tracked* read of y is
# then not recorded, so f() never reruns when y changes.
def test_finding9_untracked_blocks_interleaved_across_tasks_lose_a_tracked_read():
    async def main():
        rt = incr.Runtime()
        x = rt.input("x", 1)
        y = rt.input("y", 10)
        z = rt.input("z", 100)
        f_in, g_in, f_out, g_out = (asyncio.Event() for _ in range(4))

        @incr.cell
        async def f():
            with incr.untracked():
                a = x.get()
                f_in.set()
                await g_in.wait()          # g enters its untracked block
            f_out.set()
            await g_out.wait()             # g leaves its untracked block
            return a + y.get()             # tracked

        @incr.cell
        async def g():
            await f_in.wait()
            with incr.untracked():
                b = z.get()
                g_in.set()
                await f_out.wait()
            g_out.set()
            return b

        with rt:
            assert await asyncio.wait_for(asyncio.gather(f(), g()), 5) == [11, 100]
            y.set(20)
            assert await f() == 21

    run(main())
