"""Async cells and async calls (internal): how the engine works with asyncio.

The trace is changed by one thread, the one running the event loop; the engine's algorithms
(demand, verification, run, record, stabilize) stay synchronous. What makes them work with
``async def`` is one rule and two pieces:

- **Unwind and redo.** Sync code that meets async work it cannot do without blocking (an
  async cell that must run, an async generator's or validator's call, an instance another
  task is running) raises ``incr.errors._Suspend`` naming that work. Everything between the
  point and the nearest *restart point* unwinds and records nothing (a sync run that is
  unwound leaves its instance as it was, stale). The restart point awaits the work -- each
  piece once, whoever asks (single flight: ``rt.inflight``) -- and runs its sync step again,
  which now finds the work done. The restart points are the awaits of incr: ``await f(x)``
  / ``await cell.aget(x)`` (``ademand``), an async cell's run (``arun``: its body runs again),
  and ``rt.astabilize()`` (the pass runs again; callbacks run once, in the pass that ends).
- **Per-task frames.** An async cell's body runs as a coroutine stepped by ``_Stepper``,
  which makes the task's own frame stack the runtime's running stack for the length of each
  step and puts it back before yielding to the loop, so reads always land in the frame of the
  computation that made them, whatever interleaves.
- **Cycles across tasks.** A task that waits for work records it in ``rt.awaiting``; before
  waiting for an instance another task runs, the chain of what that task waits for is
  walked: reaching the waiter is a ``CycleError``, not a deadlock.

Sync code with no loop running (a plain call, ``rt.stabilize()``) runs async work on an event
loop incr keeps per thread (``drive``). Cancelling a task that awaits incr cancels its own
work; work shared with other waiters goes on for them (it is shielded); a cancelled run
records nothing.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import threading
import time
import weakref
from typing import Any

try:
    import _signal    # the C functions (signal.signal's enum wrapping costs ~20 us a drive)
except ImportError:   # pragma: no cover - not CPython
    import signal as _signal

from incr import _core
from incr.errors import CycleError, IncrError, _OutOfTime, _Suspend

_tl = threading.local()
_get_running_loop = asyncio._get_running_loop   # (C functions, bound once)
_set_running_loop = asyncio._set_running_loop
_TASK_FRAMES = _core._task_frames_var()         # the contextvar of a task's frames
_awaiting = _core._awaiting     # the awaitable of a demand from async code (compiled)
_pseudo: set = set()  # frames of async generator and validator calls in flight
_op_loops: dict = {}  # loop -> incr async operations (astabilize, awaits) running on it


def _op_began() -> None:
    loop = asyncio._get_running_loop()
    _op_loops[loop] = _op_loops.get(loop, 0) + 1


def _op_ended() -> None:
    loop = asyncio._get_running_loop()
    k = _op_loops.get(loop, 0) - 1
    if k > 0:
        _op_loops[loop] = k
    else:
        _op_loops.pop(loop, None)
_work: dict = {}      # future of work in flight -> [its task, how many wait for it, the work]


def loop_running() -> bool:
    return asyncio._get_running_loop() is not None


def _own_loop():
    loop = getattr(_tl, "loop", None)
    if loop is None or loop.is_closed():
        loop = _tl.loop = asyncio.new_event_loop()
    return loop


def drive(coro, context=None) -> Any:
    """Run ``coro`` to completion on this thread's own event loop (sync code, no loop running).

    Ctrl-C, as ``asyncio.Runner`` takes it: on the main thread, while Python's default SIGINT
    handler is in place, a handler of incr's stands in for it. A Ctrl-C that lands in the
    event loop's own code (between two steps: raising there would lose the step it was about
    to take, and nothing would ever finish that task) cancels the main task instead; once it
    has unwound, KeyboardInterrupt is raised (unless something else cancelled it too:
    ``uncancel``). One that lands in a task's own step -- a cell's body, incr's pass -- raises
    KeyboardInterrupt there, as the default handler does (the step ends with it: nothing of the
    loop is lost, and a long sync computation stays interruptible). A second Ctrl-C raises at
    once. Whatever ends the run early, every task it left is cancelled and waited for, but
    only while something can still wake one of them (``_settle``)."""
    loop = _own_loop()
    task = loop.create_task(coro, context=context)
    sigint = _Sigint.install(loop, task)
    try:
        try:
            return loop.run_until_complete(task)
        except asyncio.CancelledError:
            if sigint is not None and sigint.count and task.done() and task.cancelled():
                uncancel = getattr(task, "uncancel", None)
                if uncancel is None or uncancel() == 0:
                    raise KeyboardInterrupt() from None
            raise
    except BaseException:
        # interrupted (Ctrl-C) or failed: no task of this call outlives it. (The loop has
        # stopped, so no task of it is current: one still marked current -- an interrupt
        # that kept a step from putting back the task it replaced -- would make the loop
        # refuse to step every task below, and the settling would never end.)
        try:
            if _current_task(loop) is not None:
                _task_swap(loop, None)
            _settle(loop, [t for t in asyncio.all_tasks(loop) if not t.done()])
        except BaseException:
            pass          # (a second Ctrl-C while it unwinds: out at once)
        raise
    finally:
        if sigint is not None:
            sigint.restore()


_ASYNCIO_DIR = os.path.dirname(asyncio.__file__) + os.sep
_SIGINT = int(_signal.SIGINT)


class _Sigint:
    """incr's SIGINT handler while ``drive`` runs the loop (asyncio.Runner's, refined)."""

    __slots__ = ("loop", "task", "count", "handler", "wakeup")

    @classmethod
    def install(cls, loop, task):
        # asyncio.Runner's rules: only on the main thread, only in place of the default handler
        if threading.get_ident() != threading.main_thread().ident or \
                _signal.getsignal(_SIGINT) is not _signal.default_int_handler:
            return None
        self = cls()
        self.loop, self.task, self.count, self.wakeup = loop, task, 0, False
        self.handler = self.on_sigint
        try:
            _signal.signal(_SIGINT, self.handler)
        except ValueError:          # signals not available here (an embedded interpreter)
            return None
        # a Ctrl-C that lands just before the loop blocks in select() would wait for the
        # select's timeout (for good, with no timer): the signal's byte wakes it, as for
        # asyncio's own signal handlers (unless the program has a wakeup fd of its own)
        csock = getattr(loop, "_csock", None)
        if csock is not None:
            try:
                old = _signal.set_wakeup_fd(csock.fileno())
            except (ValueError, OSError):
                old = -1
            else:
                self.wakeup = old == -1
                if not self.wakeup:
                    _signal.set_wakeup_fd(old)
        return self

    def on_sigint(self, signum, frame):
        self.count += 1
        if self.count == 1 and not self.task.done() and _in_loop_code(self.loop, frame):
            self.task.cancel()
            self.loop.call_soon_threadsafe(_nothing)   # wake a loop blocked in select()
            return
        raise KeyboardInterrupt()

    def restore(self) -> None:
        if self.wakeup:
            try:
                _signal.set_wakeup_fd(-1)
            except (ValueError, OSError):
                pass
        if _signal.getsignal(_SIGINT) is self.handler:
            _signal.signal(_SIGINT, _signal.default_int_handler)


def _nothing() -> None:
    pass


def _in_loop_code(loop, frame) -> bool:
    """Whether the signal interrupted the event loop's machinery (asyncio's own code, or no
    task's step at all) rather than code a task's step runs."""
    if asyncio.current_task(loop) is None:
        return True
    return frame is None or frame.f_code.co_filename.startswith(_ASYNCIO_DIR)


def _settle(loop, pending: list) -> None:
    """Cancel ``pending`` (tasks a run left) and run the loop until they are done -- but only
    while one of them may still be woken. A task whose step was lost (KeyboardInterrupt raised
    inside the loop's own code) is never woken again, and waiting for it would hang: once the
    loop has no callback ready and no timer due for a while, the tasks left are given up, each
    coroutine closed (its ``finally`` blocks run: incr's bookkeeping is undone)."""
    if not pending:
        return
    for t in pending:
        t.cancel()
    loop.run_until_complete(_settling(loop, pending))
    for t in pending:
        if not t.done():
            t._log_destroy_pending = False
            try:
                t.get_coro().close()
            except BaseException:
                pass


async def _settling(loop, pending: list, grace: float = 0.25) -> None:
    quiet_since = None
    left = pending
    while True:
        still = [t for t in left if not t.done()]
        if not still:
            return
        ready = getattr(loop, "_ready", None)          # (a loop that does not tell:
        timers = getattr(loop, "_scheduled", None)     # quiet unless a task finished)
        busy = len(still) < len(left) or (
            ready is not None and timers is not None
            and (len(ready) > 0 or any(not h._cancelled for h in timers)))
        left = still
        now = time.monotonic()
        if busy:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = now
        elif now - quiet_since > grace:
            return
        await asyncio.sleep(0 if quiet_since is None else 0.01)


def drive_call(rt, coro, again, deadline=None) -> Any:
    """An async generator's or validator's call from sync code, on this thread's loop: inside
    it, cells are awaited (async code), so the running frame counts as an async one.

    A sync step inside the call (a plain call of a sync cell that needs async work) may
    unwind it (``_Suspend``): this is its restart point. The work is done on the same loop
    and the call is made again (``again()``: a new coroutine), as the nearest await of incr
    does in async code. ``deadline``: as for ``before``."""
    frames = rt._frames()
    top = frames[-1] if frames else None
    mine = top is not None and top not in _pseudo
    if mine:
        _pseudo.add(top)
    try:
        while True:
            try:
                return drive(before(coro, deadline))
            except _Suspend as s:
                chain = [rt._frame_info(f)[0] for f in rt._frames()]
                drive(do_works(rt, s.works, chain))
            coro = again()
    finally:
        if mine:
            _pseudo.discard(top)


# -- work a sync step can ask for ----------------------------------------------------------


class Run:
    """Run an async instance (its body, as a task)."""

    __slots__ = ("inst", "parent", "key")

    def __init__(self, inst, parent: tuple):
        self.inst = inst
        self.parent = parent
        self.key = inst

    async def do(self, rt) -> None:
        try:
            await arun(rt, self.inst, self.parent)
        except Exception:
            pass     # recorded in the trace: the waiters' steps meet it where they read it


class Wait:
    """Wait for an instance another task is running."""

    __slots__ = ("inst", "key")

    def __init__(self, inst):
        self.inst = inst
        self.key = inst

    async def do(self, rt) -> None:      # never started: only waited for
        return None


class Call:
    """Make one async call for an LLM node (its generator, or a validator) and keep the
    outcome where the node's loop takes it on its next run (``sink[skey]``, as a call run
    ahead in a thread: ``(outcome, reads, seconds)``)."""

    __slots__ = ("key", "factory", "sink", "skey", "inst", "deadline")

    def __init__(self, st, skey, factory, inst, deadline=None):
        self.key = ("call", id(st), skey)
        self.factory = factory
        self.sink = st.prefetched
        self.skey = skey
        self.inst = inst
        self.deadline = deadline          # time.monotonic() past which the call is cancelled

    async def do(self, rt) -> None:
        f = rt._pseudo_frame(self.inst)
        _pseudo.add(f)                    # inside the call, cells are awaited (async code)
        t0 = time.monotonic()
        try:
            out = await before(_Stepper(rt, self.factory(), [f]), self.deadline)
        except asyncio.CancelledError:
            raise
        except BaseException as e:        # kept: the node's loop raises it where it called
            out = e
        finally:
            _pseudo.discard(f)
        _node, reads = rt._frame_info(f)
        # (a read of its own node -- a cycle, met in the call as CycleError -- is no
        # dependency: replaying it in the node's run would raise the cycle again there)
        self.sink[self.skey] = (out, [(d, d._changed_at) for d in reads if d is not self.inst],
                                time.monotonic() - t0)


async def restarting(rt, make):
    """Await ``make()`` -- an async generator's or validator's call, in the step of its
    ``Call`` -- as a restart point: a sync step inside it (a plain call of a sync cell) that
    unwinds for async work has that work done, and the call is made again. (Handing the
    unwinding back to the node's loop instead would keep work that may be done by someone
    else meanwhile, and do it twice.)"""
    while True:
        try:
            return await make()
        except _Suspend as s:
            works = s.works
        await do_works(rt, works, [rt._frame_info(f)[0] for f in rt._frames()])


async def before(aw, deadline):
    """Await ``aw``, cancelling it at ``deadline`` (time.monotonic(); None: no limit); then
    raise incr.errors._OutOfTime (Budget(max_seconds) with a call in flight)."""
    if deadline is None:
        return await aw
    if _timeout is None:                                        # (3.10)
        try:
            out = await asyncio.wait_for(aw, max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            raise _OutOfTime() from None
        if time.monotonic() >= deadline:
            raise _OutOfTime()       # it swallowed the cancellation and returned late
        return out
    cm = _timeout(max(0.0, deadline - time.monotonic()))
    try:
        async with cm:
            out = await aw
    except TimeoutError:
        raise _OutOfTime() from None
    if cm.expired():
        raise _OutOfTime()           # it swallowed the deadline's cancellation, returned late:
    return out                       # its late result is never used


_timeout = getattr(asyncio, "timeout", None)                    # 3.11+


# -- the task an async body runs in ---------------------------------------------------------
#
# An async cell's body runs from its first step to its last as one task: the first step is
# taken by hand (the core's run_async: most bodies finish in it, with no task and no loop
# involved), the rest in a task of incr's (Resume.go). What asyncio.current_task() returns in
# every step is one BodyTask (compiled, _core_async.pxi), made current around each step (by
# run_async, then _core._body_step), which stands for the real task that goes on with the
# body once it has one (bound in Resume.go): asyncio.timeout, TaskGroup and anyio's cancel
# scopes, bound to current_task() when entered, then cancel the body's run and nothing else
# (never the task that demanded it). The swaps are compiled: a Ctrl-C never lands between a
# swap and its restore.

_current_task = asyncio.current_task
_task_swap = _core._task_swap     # make a task current on a loop (compiled: see _body_step)
_body_step = _core._body_step     # one step of a body with its BodyTask current (compiled)


BodyTask = _core.BodyTask         # (compiled: _core_async.pxi)


# -- stepping a coroutine with its own frames ----------------------------------------------


class _Stepper:
    """Await a coroutine, making ``frames`` the runtime's running stack during each of its
    steps (and only then)."""

    __slots__ = ("rt", "coro", "frames", "first", "quiet", "body")

    def __init__(self, rt, coro, frames: list, first=None, body=None):
        self.rt = rt
        self.coro = coro
        self.frames = frames
        self.first = first          # what the coroutine yielded in a step already taken
        self.quiet = -1             # this task's untracked frame (incr.untracked), or -1
        self.body = body            # the BodyTask current in its steps (None: the real task)

    def __await__(self):
        rt, coro = self.rt, self.coro
        value, exc = None, None
        if self.first is not None:
            try:
                value, exc = (yield self.first), None
            except BaseException as e:
                value, exc = None, e
        tf = _core._task_frames_var()
        body = self.body
        while True:
            # (interrupt-safe: the running stack is put back whatever a Ctrl-C interrupts --
            # saved before it is swapped, each restore in the finally of the one before)
            saved = rt._frames()
            try:
                rt._frames_swap(self.frames)
                saved_q = rt._quiet_swap(self.quiet)
                try:
                    token = tf.set(self.frames)   # tasks it spawns in this step read into its frame
                    try:
                        if body is not None:
                            # the body's task in every step (its BodyTask), never the one
                            # stepping it: swapped in and back in C (no Ctrl-C lands between
                            # the swap and its restore: the loop would refuse every task after)
                            y = _body_step(body, coro, value, exc)
                        elif exc is None:
                            y = coro.send(value)
                        else:
                            y = coro.throw(exc)
                    finally:
                        tf.reset(token)
                finally:
                    self.quiet = rt._quiet_swap(saved_q)
            except StopIteration as s:
                return s.value
            finally:
                rt._frames_swap(saved)
            try:
                value, exc = (yield y), None
            except BaseException as e:     # cancellation, or what the awaited future raised
                value, exc = None, e


def _on(rt, frames: list, fn, *args) -> Any:
    """Call ``fn(*args)`` with ``frames`` as the running stack (a task's own)."""
    saved = rt._frames()
    try:
        rt._frames_swap(frames)
        return fn(*args)
    finally:
        rt._frames_swap(saved)


# -- the restart points --------------------------------------------------------------------


async def arun(rt, n, parent: tuple) -> None:
    """Run async instance ``n`` (called by ``parent``, the frames of its caller) and record
    the run, exactly as a sync run is recorded. Its body runs again if a sync step inside it
    had to unwind for async work."""
    chain = [rt._frame_info(f)[0] for f in parent] + [n]
    while True:
        frames = list(parent)
        saved = rt._frames_swap(frames)
        try:
            f, had, invalid, start = rt._run_start(n)
            try:
                coro = rt._invoke(n)
            except BaseException as e:
                rt._run_failed(n, f, had, invalid, e)
                raise
        finally:
            rt._frames_swap(saved)
        try:
            value = await _Stepper(rt, coro, frames)
        except _Suspend as s:
            _on(rt, frames, rt._run_failed, n, f, had, invalid, s)
            await do_works(rt, s.works, chain)
            continue
        except BaseException as e:
            _on(rt, frames, rt._run_failed, n, f, had, invalid, _closed(e))
            raise
        try:
            _on(rt, frames, rt._run_finish, n, f, had, value, start)
        except BaseException:
            if frames and frames[-1] is f:    # interrupted before it was recorded: unwound
                _on(rt, frames, rt._run_failed, n, f, had, invalid, asyncio.CancelledError())
            raise
        return


def _closed(e: BaseException) -> BaseException:
    """What a run that raised ``e`` records: a run closed unfinished (GeneratorExit: its loop
    was closed under it) records nothing, as a cancelled one."""
    return asyncio.CancelledError() if isinstance(e, GeneratorExit) else e


def went_on(rt, n, coro, y, frames, f, had, invalid, start, body=None) -> bool:
    """The engine's run of an async instance, from its verification or a demand (sync): its
    body's first step, taken by the core on the caller's stack (``run_async``,
    _core_async.pxi), had to wait (it yielded ``y``). An async cell whose inputs are ready
    usually finishes in that step, with no event loop involved and no call of this. Here it
    goes on with a stack of its own (``frames``): as a task of the running loop (the caller
    unwinds to the nearest restart point, which waits for it), or, in sync code, on this
    thread's loop."""
    stack = rt._frames()
    work = suspend = None
    try:
        work = Resume(n, coro, y, frames, f, had, invalid, start, body)
        stack.pop()                     # n's frame leaves the caller's stack
        if loop_running():
            rt.inflight[n] = None       # in flight: whatever else asks for it waits
            rt.unwinding.append(work)   # until a restart point takes it (do_works)
            suspend = _Suspend([work])
    except BaseException:
        # interrupted (Ctrl-C) before the run was handed on: nobody goes on with it
        if stack and stack[-1] is f:
            stack.pop()
        abandon_step(rt, work or Resume(n, coro, y, frames, f, had, invalid, start, body))
        raise
    if suspend is not None:
        raise suspend
    try:
        # (in the body's own Context, that of its first step: run_async)
        drive(work.go(rt), None if body is None else body.ctx)
    except BaseException:
        work.drop(rt)                   # (nothing if its run was recorded or failed)
        _strand_check(rt)
        raise
    return True


def _strand_check(rt) -> None:
    # sync code: the loop this call drove is done, so a run its tasks left waiting for a
    # restart point (an interrupt raised while its _Suspend unwound) has nobody to go on
    # with it: closed, recording nothing
    if rt.unwinding:
        abandon(rt, list(rt.unwinding))


def abandon_step(rt, work) -> None:
    """A first step that had to wait and that nobody will go on with (an interrupt before
    ``went_on`` handed it on; the core calls this if it lands as went_on begins, its frame
    still on the caller's stack): closed, recording nothing, nothing left in flight."""
    if rt.unwinding:
        rt.unwinding[:] = [w for w in rt.unwinding if w is not work]
    work.drop(rt)


def redo(rt, n, works: list) -> bool:
    """The first step of async instance ``n`` (``run_async``) unwound for ``works`` in sync
    code: nothing above waits for the work, so it is done here, on this thread's loop, and
    the body runs again (as a restart point would)."""
    parent = tuple(rt._frames())
    try:
        drive(_redo(rt, n, works, parent))
    except BaseException:
        _strand_check(rt)
        raise
    return True


async def _redo(rt, n, works: list, parent: tuple) -> None:
    """Do ``works`` (what a first step of ``n`` unwound for), then run ``n`` again."""
    await do_works(rt, works, [rt._frame_info(f)[0] for f in parent] + [n])
    await arun(rt, n, parent)


class Resume:
    """Go on with an async instance's run that had to wait in its first step."""

    __slots__ = ("inst", "coro", "y", "frames", "f", "had", "invalid", "start", "key",
                 "settled", "body")

    def __init__(self, inst, coro, y, frames, f, had, invalid, start, body=None):
        self.inst, self.coro, self.y, self.frames = inst, coro, y, frames
        self.f, self.had, self.invalid, self.start = f, had, invalid, start
        self.key = inst
        self.settled = False        # its run was recorded, failed or dropped
        self.body = body            # its BodyTask (current in its first step)

    async def go(self, rt) -> None:
        n = self.inst
        if self.body is not None:
            self.body._bind(_current_task())    # this task goes on with the body
        try:
            value = await _Stepper(rt, self.coro, self.frames, self.y, self.body)
        except _Suspend as s:
            self._failed(rt, s)
            chain = [rt._frame_info(f)[0] for f in self.frames]
            await do_works(rt, s.works, chain)
            await arun(rt, n, tuple(self.frames[:-1]))     # its body runs again
            return
        except BaseException as e:
            self._failed(rt, e)
            raise
        try:
            _on(rt, self.frames, rt._run_finish, n, self.f, self.had, value, self.start)
        except BaseException:
            if self._open():                # interrupted before it was recorded: unwound
                self._failed(rt, asyncio.CancelledError())
            raise
        self.settled = True

    async def do(self, rt) -> None:
        try:
            await self.go(rt)
        except Exception:
            pass     # recorded in the trace: the waiters' steps meet it where they read it

    def _failed(self, rt, e) -> None:
        if self.settled:
            return                  # (dropped already: a close of its task comes later)
        if self._open():
            _on(rt, self.frames, rt._run_failed, self.inst, self.f, self.had, self.invalid,
                _closed(e))
        self.settled = True

    def _open(self) -> bool:
        """Its run is neither recorded nor failed: its frame is still on top of its stack."""
        return bool(self.frames) and self.frames[-1] is self.f

    def drop(self, rt) -> None:
        """Nobody will wait for it (the unwinding reached no restart point): close the
        coroutine, record nothing."""
        if self.settled or not self._open():
            self.settled = True
            return
        if rt.inflight.get(self.inst, 0) is None:
            del rt.inflight[self.inst]
        saved = rt._frames_swap(self.frames)
        try:
            self.coro.close()
        except BaseException:
            pass
        finally:
            rt._frames_swap(saved)
        self._failed(rt, asyncio.CancelledError())


def abandon(rt, works) -> None:
    """A _Suspend that reached no restart point (sync code inside a running loop): started
    work nobody will finish is closed, recording nothing."""
    if rt.unwinding:
        taken = {id(w) for w in works}
        rt.unwinding[:] = [w for w in rt.unwinding if id(w) not in taken]
    for w in works:
        drop = getattr(w, "drop", None)
        if drop is not None:
            drop(rt)


def call(rt, n):
    """Calling an async cell: in async code (a running loop, at top level or in an async
    cell's body) an awaitable; in sync code its value."""
    # (in an async cell's body, the usual case, the core returns the awaitable itself:
    # Cell.call_slow)
    pf = rt.prefetch
    if pf is not None and pf.is_worker():
        # a worker thread (a thunk or run lent to it, a call run ahead) is sync code: the
        # runtime's frames are the driver's, whose top may be an async call's meanwhile (a
        # validator's, say), not this thread's; demand() hands the read to the pass
        return rt._demand(n)
    frames = rt._frames()
    if frames:
        top = frames[-1]
        node, _reads = rt._frame_info(top)
        if node.cell.is_async or top in _pseudo:
            return _awaiting(rt, n, tuple(frames))      # in an async cell's body or call
        loop = _get_running_loop()
        if loop is not None and loop is not getattr(_tl, "loop", None) and \
                loop not in _op_loops:
            # a loop the sync cell started itself (asyncio.run inside it): async code
            return _awaiting(rt, n, tuple(frames))
    elif loop_running():
        tf = _TASK_FRAMES.get()
        if tf:
            return _awaiting(rt, n, tuple(tf))            # a task an async run spawned
        if _get_running_loop() is not getattr(_tl, "loop", None):
            return _awaiting(rt, n, ())                   # top-level async code
        # else sync code that incr runs on this thread's loop (a top-level incr.gather)
    return rt._demand(n)


def in_task(rt, n, tf):
    """A sync cell called in a task that an async cell's run spawned itself: demanded as that
    run's read (on a copy of its stack). If it has to wait for async work, the unwinding
    (``_Suspend``) ends the task and reaches the run's body where it awaits the task (an
    ``asyncio.gather``, say): the run is the restart point, as for a read in its own step."""
    frames = list(tf)
    saved = rt._frames_swap(frames)
    rt.catching += 1
    try:
        return rt._demand(n)
    finally:
        rt.catching -= 1
        rt._frames_swap(saved)


def ademand(rt, n):
    """``await cell.aget(...)``: the value of instance ``n``, from async code."""
    return _awaiting(rt, n, tuple(rt._frames()))


async def _ademand(rt, n, parent: tuple, works=None) -> Any:
    """Awaiting instance ``n`` (the awaitable ``_awaiting`` makes, _core_async.pxi), where it
    has to wait: ``works``, what its demand in the awaiting step unwound for, or None (it is
    awaited elsewhere than in the step that called it: top level, another task). The demand
    is made on a copy of ``parent``, the stack of the computation that called it, each time
    after the work is done (a restart point)."""
    top = not parent
    if top:
        _op_enter(rt)
    try:
        chain = None
        while True:
            if works is not None:
                if chain is None:
                    chain = [rt._frame_info(f)[0] for f in parent]
                await do_works(rt, works, chain)
            frames = list(parent)
            saved = rt._frames()
            rt.catching += 1
            try:
                rt._frames_swap(frames)
                return rt._demand_top(n) if top else rt._demand(n)
            except _Suspend as s:
                works = s.works
            finally:
                rt.catching -= 1
                rt._frames_swap(saved)
    finally:
        if top:
            _op_exit(rt)


def _op_enter(rt) -> None:
    """A top-level async operation begins: the loop's thread holds the runtime until it ends,
    failures last across its restarts, and sync cells called on this loop meanwhile are sync
    code (their calls of async cells return values)."""
    rt._enter()
    rt._keep_failed(1)
    _op_began()


def _op_exit(rt) -> None:
    """The operation ends (returned, failed or interrupted): a started run still waiting in
    ``rt.unwinding`` for a restart point is one an interrupt kept from reaching it (raised
    while its ``_Suspend`` unwound): nobody will go on with it, so it is closed, recording
    nothing. Every step is taken whatever the one before raised."""
    try:
        if rt.unwinding:
            abandon(rt, list(rt.unwinding))
    finally:
        try:
            _op_ended()
        finally:
            try:
                rt._keep_failed(-1)
            finally:
                rt._leave()


async def gather_top(rt, thunks):
    """A top-level ``incr.gather(*thunks)`` from sync code: made on this thread's loop, so that
    the async work of all the thunks (async generators and validators, async cells) is done
    concurrently, then the gather again (as ``astabilize`` does with a pass)."""
    _op_enter(rt)
    token = _core._active_var().set(rt)
    try:
        while True:
            rt.catching += 1
            try:
                return _core.gather(*thunks)
            except _Suspend as s:
                works = s.works
            finally:
                rt.catching -= 1
            await do_works(rt, works, [])
    finally:
        _core._active_var().reset(token)
        _op_exit(rt)


async def astabilize(rt):
    """``await rt.astabilize()``: ``rt.stabilize()`` for async code. The async work of every
    observed instance runs concurrently; callbacks run once, when everything is up to date."""
    _op_enter(rt)
    if rt.llm is not None:
        from incr import llmnodes
        llmnodes.stabilization_begins(rt)    # one PassStarted/PassFinished for all its passes
        if rt.llm.pass_budget is not None:
            llmnodes.pass_reset(rt)   # Runtime(pass_budget=): this stabilization begins
    early: list = []          # runs made by the async work between passes, for the report
    t0 = time.perf_counter()
    try:
        while True:
            rt.catching += 1
            try:
                report = rt.stabilize()
                report._log[:0] = early
                report.seconds = time.perf_counter() - t0
                return report
            except _Suspend as s:
                works = s.works
                early.extend(getattr(s, "log", None) or ())   # runs of the stopped pass
            finally:
                rt.catching -= 1
            rt._report_into(early)
            try:
                await do_works(rt, works, [])
            finally:
                rt._report_into(None)
    finally:
        _op_exit(rt)


# -- doing the work --------------------------------------------------------------------------


async def do_works(rt, works: list, chain: list) -> None:
    """Do each piece of work once (single flight), concurrently, and wait for all of it.
    ``chain``: the instances of the waiting computation, innermost last (for cycles)."""
    loop = asyncio.get_running_loop()
    futs, keys, seen = [], [], set()
    try:
        if rt.unwinding:
            taken = {id(w) for w in works}
            rt.unwinding[:] = [w for w in rt.unwinding if id(w) not in taken]
        for w in works:
            if w.key in seen:
                continue
            seen.add(w.key)
            fut = rt.inflight.get(w.key)
            if fut is None:
                if isinstance(w, Resume) and w.settled:
                    continue             # taken and finished by another restart point
                if isinstance(w, Call) and (w.skey in w.sink or rt._has(w.inst)):
                    # made for another waiter, which has not taken it yet (whichever step runs
                    # first takes it: single flight), or no longer needed: its node was
                    # brought up to date meanwhile, by another waiter's step
                    continue
                if isinstance(w, Wait):
                    if w.key not in rt.inflight:
                        continue         # it finished meanwhile: the step sees its result
                    # a run that unwound to a restart point not reached yet (a pass goes on
                    # to its next observed instance first): whoever needs it first goes on with it
                    w = _unwound(rt, w.key)
                if isinstance(w, Wait):
                    raise IncrError(f"incr: {w.inst.label_text} is in flight with nobody to "
                                    f"finish it (an internal error; please report it)")
                fut = loop.create_future()
                task = None
                rt.inflight[w.key] = fut
                try:
                    ctx = None
                    if isinstance(w, Resume) and w.body is not None:
                        ctx = w.body.ctx    # a body goes on in its own Context (run_async)
                    if ctx is None:
                        ctx = contextvars.copy_context()
                    ctx.run(_core._active_var().set, rt)    # the task computes on rt
                    task = loop.create_task(_perform(rt, w, fut), context=ctx)
                    task.add_done_callback(functools.partial(_finished, rt, w, fut))
                    _work[fut] = [task, 0, w]
                    if rt.unwinding and isinstance(w, Resume):
                        rt.unwinding[:] = [u for u in rt.unwinding if u is not w]
                except BaseException:
                    # interrupted (Ctrl-C) before the work was fully registered: nobody would
                    # finish it, and its future would pin the key to this loop for good
                    if task is not None:
                        task.cancel()
                    _finished(rt, w, fut)
                    raise
            else:
                if _performing.get(asyncio.current_task()) == w.key:
                    # the work waits for itself (a validator that reads its own node, say): a
                    # cycle, not a deadlock
                    label = getattr(w.inst, "label_text", str(w.key))
                    raise CycleError([label, label])
                if fut.get_loop() is not loop:
                    raise IncrError(f"incr: {getattr(w.key, 'label_text', w.key)} is being "
                                    f"computed on another event loop; a runtime's async work runs "
                                    f"on one loop at a time (use one runtime per loop)")
                if chain:
                    _check_cycle(rt, w.key, chain)
            futs.append(fut)
            keys.append(w.key)
    except BaseException:
        # interrupted (Ctrl-C) while taking the work on: a started run it took from the
        # unwinding and did not register is closed, recording nothing (nobody else has it)
        _unregistered(rt, works)
        raise
    if not futs:
        return
    me = chain[-1] if chain else None
    if me is not None:
        rt.awaiting[me] = keys
    for f in futs:
        if f in _work:
            _work[f][1] += 1
    try:
        await asyncio.gather(*[asyncio.shield(f) for f in futs])
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise
        # not this task: the work was cancelled under it (its other waiters left); the step
        # runs again and starts the work anew
    finally:
        if me is not None and rt.awaiting.get(me) is keys:
            del rt.awaiting[me]
        orphans = []
        for f in futs:
            entry = _work.get(f)
            if entry is not None:
                entry[1] -= 1
                if entry[1] == 0 and not f.done() and not loop.is_closed():
                    # its last waiter is gone (cancelled): the work is cancelled too, and
                    # records nothing
                    entry[0].cancel()
                    if entry[0] in _performing:
                        orphans.append(entry[0])
                    else:
                        # its task never started (created in this step, the loop has not
                        # run since): nothing of it ran, so it is over now -- its run
                        # closed, recording nothing. Left to the loop, it would be marked
                        # running until the loop runs again: after the operation ended,
                        # when this waiter is a coroutine being closed (a pass interrupted
                        # by Ctrl-C drops its started work), which cannot wait. (The
                        # task's done callback then finds it finished.)
                        _finished(rt, entry[2], f)
        if orphans:
            # structured: no work outlives its last waiter -- the cancelled tasks unwind
            # (their runs closed, recording nothing) before this waiter goes on, so the trace
            # is consistent as soon as it wakes (I6: nothing left marked running)
            await _unwound_all(orphans)


async def _unwound_all(tasks) -> None:
    """Wait until ``tasks`` are done, whatever cancels the waiter meanwhile (an anyio cancel
    scope cancels again at every await of its task); then raise that cancellation."""
    cancelled = None
    while True:
        try:
            await asyncio.wait(tasks)
            break
        except asyncio.CancelledError as e:
            cancelled = e
            if all(t.done() for t in tasks):
                break
    if cancelled is not None:
        raise cancelled


def dead(rt, key) -> bool:
    """True if the work in flight for ``key`` is pinned to a closed event loop (the loop that
    ran it was closed with it pending, as when the thread that owned the loop ends): it is
    dropped, recording nothing (its instance stale, to run again)."""
    fut = rt.inflight.get(key)
    if fut is None or not fut.get_loop().is_closed():
        return False
    entry = _work.get(fut)
    if entry is not None:
        try:
            entry[0].get_coro().close()     # its handlers run: a closed run records nothing
        except BaseException:
            pass
        try:
            _finished(rt, entry[2], fut)    # (if it never started)
        except RuntimeError:
            pass                            # (its future's callbacks: 'Event loop is closed')
    if rt.inflight.get(key) is fut:
        del rt.inflight[key]
    return True


def _unregistered(rt, works) -> None:
    """``do_works`` was interrupted: each started run it was to take on (one of ``works``, or
    the unwound run of one's key) that is still marked in flight with no future is closed,
    recording nothing."""
    keys = {id(w.key) for w in works}
    runs = [w for w in works if isinstance(w, Resume)]
    runs += [u for u in rt.unwinding if isinstance(u, Resume) and id(u.key) in keys]
    if rt.unwinding:
        rt.unwinding[:] = [u for u in rt.unwinding if not any(u is w for w in runs)]
    for w in runs:
        if not w.settled and rt.inflight.get(w.key, 0) is None:
            w.drop(rt)


def _unwound(rt, key):
    """The started run of ``key`` waiting in ``rt.unwinding`` for a restart point (a Wait for
    ``key`` if there is none); ``do_works`` takes it out once it has registered it."""
    for u in rt.unwinding:
        if isinstance(u, Resume) and u.key is key and not u.settled:
            return u
    return Wait(key)


_performing: dict = {}   # task -> the key of the work it performs


async def _perform(rt, w, fut) -> None:
    task = asyncio.current_task()
    _performing[task] = w.key
    try:
        if isinstance(w, Call) and rt.max_concurrency is not None:
            # model calls (never nested: a call waits for no other work) are limited
            async with _limit(rt):
                await w.do(rt)
        else:
            await w.do(rt)
    except BaseException as e:
        # what the work itself could not keep (an interrupt, a bug of incr's): its waiters
        # raise it, rather than asking for the same work again
        if not fut.done():
            if isinstance(e, asyncio.CancelledError):
                fut.cancel()
            else:
                fut.set_exception(e)
        if not isinstance(e, Exception):
            raise
    finally:
        _performing.pop(task, None)
        _finished(rt, w, fut)


def _finished(rt, w, fut, _task=None) -> None:
    """The work is over (done, failed, cancelled -- even before it started): forget it, and
    close a run that never got to go on (recording nothing)."""
    key = w.key
    if isinstance(w, Resume) and not w.settled:
        w.drop(rt)
    elif getattr(w, "claim", False):
        w.drop(rt)          # a detached run-ahead round's claim (incr.remote.RoundCall)
    if rt.inflight.get(key) is fut:
        del rt.inflight[key]
    _work.pop(fut, None)
    if not fut.done():
        fut.set_result(None)


_limits = weakref.WeakKeyDictionary()   # runtime -> {loop: Semaphore of max_concurrency}


def _limit(rt) -> asyncio.Semaphore:
    per_loop = _limits.get(rt)
    if per_loop is None:
        per_loop = _limits[rt] = weakref.WeakKeyDictionary()
    loop = asyncio.get_running_loop()
    sem = per_loop.get(loop)
    if sem is None:
        sem = per_loop[loop] = asyncio.Semaphore(rt.max_concurrency)
    return sem


def _check_cycle(rt, key, chain: list) -> None:
    """Waiting for ``key`` (run by another task) from ``chain``: a CycleError if that task
    waits, directly or not, for something on ``chain``."""
    mine = {id(x): i for i, x in enumerate(chain)}
    path = [key]
    stack = [(key, 0)]
    seen = set()
    while stack:
        k, depth = stack.pop()
        del path[depth:]
        path.append(k)
        if id(k) in mine:
            labels = [x.label_text for x in chain[mine[id(k)]:]]
            labels += [p.label_text for p in path[:-1] if hasattr(p, "label_text")]
            raise CycleError(labels + [labels[0]])
        if id(k) in seen:
            continue
        seen.add(id(k))
        for k2 in rt.awaiting.get(k, ()):
            stack.append((k2, depth + 1))
