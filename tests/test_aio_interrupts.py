"""Ctrl-C and incr's own event loop (incr/_aio.py).

Once any async cell exists, ``rt.stabilize()`` runs on an event loop incr keeps per thread
(``_aio.drive``). These tests pin how a Ctrl-C is taken there -- as ``asyncio.Runner`` takes it:
a handler of incr's, on the main thread only and only in place of the default one, that
cancels the main task when the signal lands in the loop's own code and raises
KeyboardInterrupt once the task has unwound -- and that the runtime is usable afterwards
(``rt._check()`` clean, the next stabilize gives the from-scratch values, no run repeated).

Real signals are sent in a fresh interpreter (a hang there is a failure, not a hung run);
the sweep at the end injects KeyboardInterrupt at every line of incr/_aio.py with
``sys.settrace`` (the technique of tests/test_attack_v3.py)."""

from __future__ import annotations

import asyncio
import dis
import os
import signal
import subprocess
import sys
import textwrap
import threading
import traceback

import pytest

import incr

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


_PRELUDE = """
    import asyncio, os, signal, sys, threading, time
    import incr

    def watchdog(done, what):
        if not done.wait(20):
            print("HANG:", what, flush=True)
            os._exit(3)

    MAIN = threading.main_thread().ident

    def ctrl_c_when(event, where="select"):
        # SIGINT to the main thread, as a terminal's Ctrl-C reaches it (os.kill from this
        # thread could be taken by this thread, leaving the main one asleep in select()),
        # once ``event`` is set and the main thread runs the function named ``where`` (the
        # loop waiting in select(), or a cell's body)
        def send():
            event.wait(20)
            while sys._current_frames()[MAIN].f_code.co_name != where:
                time.sleep(0.001)
            signal.pthread_kill(MAIN, signal.SIGINT)
        threading.Thread(target=send, daemon=True).start()
"""


def _subprocess(code, timeout=60):
    code = textwrap.dedent(_PRELUDE) + textwrap.dedent(code)
    env = dict(os.environ, PYTHONPATH=ROOT)
    try:
        p = subprocess.run([sys.executable, "-c", code], env=env,
                           capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return "HANG", out
    return p.returncode, p.stdout + p.stderr




def test_a_real_ctrl_c_while_incrs_loop_waits_raises_keyboardinterrupt_and_leaves_it_usable():
    rc, out = _subprocess("""
        rt = incr.Runtime()
        x = rt.input("x", 1)
        waiting = threading.Event()
        runs = []

        @incr.cell
        async def slow():
            runs.append(x.get())
            if x.get() == 2:
                waiting.set()
                await asyncio.sleep(60)      # the loop sits in select(): Ctrl-C lands there
            return x.get() * 10

        @incr.cell
        def top():
            return slow() + 1

        o = rt.observe(top)
        rt.stabilize()
        assert o.value == 11
        x.set(2)
        done = threading.Event()
        threading.Thread(target=watchdog, args=(done, "stabilize"), daemon=True).start()
        ctrl_c_when(waiting)
        try:
            rt.stabilize()
        except KeyboardInterrupt:
            print("interrupted")
        done.set()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        rt._check()
        x.set(3)
        rt.stabilize()
        rt._check()
        print("value", o.value, "runs", runs)
    """)
    assert rc == 0, out[-3000:]
    assert "interrupted" in out and "value 31 runs [1, 2, 3]" in out, out[-3000:]


def test_a_real_ctrl_c_in_a_long_sync_cell_interrupts_it_at_once():
    """(A Ctrl-C that only cancelled the main task, as asyncio.Runner's does, would wait for the
    sync pass to reach an await: a long sync computation in rt.stabilize() could not be
    interrupted once any async cell was defined.)"""
    rc, out = _subprocess("""
        @incr.cell
        async def unused():
            return 0

        rt = incr.Runtime()
        x = rt.input("x", 1)
        busy = threading.Event()
        runs = []

        @incr.cell
        def spin():
            runs.append(x.get())
            if x.get() == 2:
                busy.set()
                while True:          # until Ctrl-C
                    pass
            return x.get() + 1

        o = rt.observe(spin)
        rt.stabilize()
        x.set(2)
        done = threading.Event()
        threading.Thread(target=watchdog, args=(done, "spin"), daemon=True).start()
        ctrl_c_when(busy, "spin")
        try:
            rt.stabilize()
        except KeyboardInterrupt:
            print("interrupted")
        done.set()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        rt._check()
        x.set(3)
        rt.stabilize()
        rt._check()
        print("value", o.value, "runs", runs)
    """)
    assert rc == 0, out[-3000:]
    assert "interrupted" in out and "value 4 runs [1, 2, 3]" in out, out[-3000:]


def test_a_second_ctrl_c_gets_out_of_a_cleanup_that_waits():
    """The first Ctrl-C cancels the run; a cell that then waits in its own clean-up is left
    by the second one, at once."""
    rc, out = _subprocess("""
        rt = incr.Runtime()
        x = rt.input("x", 1)
        waiting, cleaning = threading.Event(), threading.Event()

        @incr.cell
        async def stubborn():
            if x.get() == 2:
                waiting.set()
                try:
                    await asyncio.sleep(60)
                finally:
                    cleaning.set()
                    await asyncio.sleep(60)   # a slow clean-up
            return x.get() * 10

        o = rt.observe(stubborn)
        rt.stabilize()
        x.set(2)
        done = threading.Event()
        threading.Thread(target=watchdog, args=(done, "clean-up"), daemon=True).start()
        ctrl_c_when(waiting)
        ctrl_c_when(cleaning)
        try:
            rt.stabilize()
        except KeyboardInterrupt:
            print("interrupted")
        done.set()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        rt._check()
        x.set(3)
        rt.stabilize()
        rt._check()
        print("value", o.value)
    """)
    assert rc == 0, out[-3000:]
    assert "interrupted" in out and "value 30" in out, out[-3000:]


def _handler_seen_by_a_cell():
    seen = []
    rt = incr.Runtime()

    @incr.cell
    async def look():
        seen.append(signal.getsignal(signal.SIGINT))
        await asyncio.sleep(0)
        return 1

    rt.observe(look)
    rt.stabilize()
    return seen[0]


def test_incrs_sigint_handler_is_in_place_only_while_its_loop_runs_on_the_main_thread():
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    inside = _handler_seen_by_a_cell()
    assert inside is not signal.default_int_handler and callable(inside)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler   # put back
    assert signal.set_wakeup_fd(-1) == -1          # (the loop's wakeup fd taken back too)

    box = []
    t = threading.Thread(target=lambda: box.append(_handler_seen_by_a_cell()))
    t.start()
    t.join()
    assert box == [signal.default_int_handler]      # another thread: left alone


def test_incr_leaves_a_sigint_handler_of_the_programs_own_alone():
    def mine(signum, frame):
        pass

    old = signal.signal(signal.SIGINT, mine)
    try:
        assert _handler_seen_by_a_cell() is mine
        assert signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, old)


# -- the sweep: a Ctrl-C at every line of incr/_aio.py ---------------------------------------

import incr._aio as _aio_mod          # noqa: E402  (the file the sweep interrupts)

_AIO = _aio_mod.__file__


def _sweep_graph(rt, runs):
    """Async cells (one that waits, one that finishes in its first step, one that awaits a sync
    cell that calls async ones, a gather of two) and an async LLM node with an async validator.
    ``runs``: (name, the inputs it computed from), appended as each body returns."""
    x = rt.input("x", 1)
    y = rt.input("y", 1)

    @incr.cell
    async def leaf(k):
        await asyncio.sleep(0)                 # waits: goes on as a task (Resume / arun)
        v = x.get() * k
        runs.append((f"leaf{k}", x.get()))
        return v

    @incr.cell
    async def quick():                         # done in its first step
        v = y.get() + 1
        runs.append(("quick", y.get()))
        return v

    @incr.cell
    def mid():                                 # sync code calling async cells
        v = leaf(2) + quick()
        runs.append(("mid", x.get(), y.get()))
        return v

    @incr.validator(version="1")
    async def current(candidate):       # (an accepted candidate is revalidated when x changes:
        await asyncio.sleep(0)          # this one rejects the old, so the node regenerates)
        if candidate == x.get() * 10:
            return incr.ACK("current")
        return incr.NACK("current", counterexample=candidate)

    @incr.llm(validators=[current], version="1")
    async def gen(*, previous=None, feedback=()):
        await asyncio.sleep(0)
        v = x.get() * 10
        runs.append(("gen", x.get()))
        return v

    @incr.cell
    async def top():                           # async code: a sync cell, a gather, a model
        m = mid()
        a, b = await asyncio.gather(leaf(3), quick())
        g = await gen()
        runs.append(("top", x.get(), y.get()))
        return m + a + b + g

    cells = {"leaf2": (leaf, (2,)), "leaf3": (leaf, (3,)), "quick": (quick, ()),
             "mid": (mid, ()), "gen": (gen, ()), "top": (top, ())}
    return x, y, top, mid, cells


def _drive(rt, mode, top, mid):
    """One computation of the graph's values: (top, mid)."""
    if mode == "stabilize":
        rt.stabilize()
    elif mode == "astabilize":
        asyncio.run(rt.astabilize())
    else:                                      # a top-level demand from sync code
        with rt:
            return top(), mid()
    return None


def _from_scratch(xv, yv):
    rt = incr.Runtime()
    x, y, top, mid, _ = _sweep_graph(rt, [])
    x.set(xv)
    y.set(yv)
    with rt:
        return top(), mid()


_POINTS: dict = {}     # code object -> offsets where a real signal can be taken


def _signal_points(code) -> frozenset:
    """The offsets in ``code`` at which CPython 3.11 takes a pending signal -- so where a real
    Ctrl-C raises KeyboardInterrupt: right after a call returns (the instruction after each
    CALL), at a backward jump, and where a generator resumes after ``yield`` (RESUME 1; a
    function's start, RESUME 0, is the ``call`` event). Only there: a trace function can raise
    at any instruction, but at some (a ``try:``'s NOP, the first instructions of an ``except``
    or ``finally`` block) no signal is ever taken, and raising there skips handlers that a real
    one always meets."""
    pts = _POINTS.get(code)
    if pts is None:
        ins = list(dis.get_instructions(code))
        table = dis._parse_exception_table(code)

        def handler(offset):
            for e in table:
                if e.start <= offset < e.end:
                    return e.target
            return None

        found = set()
        for i, x in enumerate(ins):
            # (a KeyboardInterrupt raised after a call belongs to the call's instruction: the
            # one after it stands in for it where the same handler covers both -- where it does
            # not, a return's NOP say, the point cannot be reproduced and is left out)
            if x.opname == "CALL" and i + 1 < len(ins) and \
                    handler(ins[i + 1].offset) == handler(x.offset):
                found.add(ins[i + 1].offset)
            elif x.opname == "JUMP_BACKWARD" or (x.opname == "RESUME" and x.arg == 1):
                found.add(x.offset)
        pts = _POINTS[code] = frozenset(found)
    return pts


def _line_tracer(at):
    """Counts the points of incr/_aio.py's code where a Ctrl-C can land (``_signal_points``, and
    each function's start) as they are reached; raises KeyboardInterrupt at the ``at``-th (once;
    at=0: never). ``state``: [points seen, where it fired]."""
    state = [0, False]
    starting = set()

    def hit(frame):
        state[0] += 1
        if state[0] == at:
            state[1] = f"{frame.f_code.co_name}:{frame.f_lineno}@{frame.f_lasti}"
            raise KeyboardInterrupt

    def tracer(frame, event, arg):
        if frame.f_code.co_filename != _AIO:
            return None
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        if not state[1]:
            if event == "call":
                if frame.f_lasti <= 0:
                    starting.add(frame)     # (raised at its first instruction: raising at
                                            # the call event itself upsets CPython's count
                                            # of the C stack's depth)
            elif event == "opcode" and (frame in starting
                                        or frame.f_lasti in _signal_points(frame.f_code)):
                starting.discard(frame)
                hit(frame)
        return tracer

    return tracer, state


def _one_point(mode, at, want):
    runs = []
    rt = incr.Runtime()
    x, y, top, mid, cells = _sweep_graph(rt, runs)
    if mode != "demand":
        o_top, o_mid = rt.observe(top), rt.observe(mid)
    values = (lambda: (o_top.value, o_mid.value)) if mode != "demand" else None

    def compute():
        got = _drive(rt, mode, top, mid)
        return got if values is None else values()

    compute()
    x.set(2)
    y.set(5)
    del runs[:]
    tracer, state = _line_tracer(at)
    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        compute()
        interrupted = False
    except KeyboardInterrupt:
        interrupted = True
    finally:
        sys.settrace(old)
    where = f"{mode}, line {at} of incr/_aio.py"
    where = f"{where} ({state[1]})"
    assert interrupted == bool(state[1]), where
    try:
        rt._check()
    except AssertionError as e:
        raise AssertionError(f"{where}: {e}") from None
    done = {name for name, (cell, args) in cells.items()
            if (inst := rt._instance(cell, args, {}, False)) is not None
            and not rt._stale(inst)}
    before = list(runs)
    got = compute()
    rt._check()
    assert got == want, where
    again = [r[0] for r in runs[len(before):]]
    redone = done & set(again)
    assert not redone, f"{where}: recorded before the interrupt, run again: {sorted(redone)}"
    for name in cells:
        assert [r[0] for r in runs].count(name) <= 2, f"{where}: {name} ran {runs}"
    return state[0], interrupted


@pytest.mark.parametrize("mode", ["stabilize", "astabilize", "demand"])
def test_a_ctrl_c_at_any_line_of_incrs_async_machinery_leaves_the_runtime_usable(mode):
    want = _from_scratch(2, 5)
    total, interrupted = _one_point(mode, 0, want)     # counts the lines a change runs
    assert total > 100 and not interrupted, total
    found = []
    for at in range(1, total + 1):
        try:
            _one_point(mode, at, want)
        except BaseException as e:  # (every finding, not only the first)
            if not isinstance(e, Exception):
                e = AssertionError(f"{mode}, point {at}: {e!r} raised again after the "
                                   f"interrupt: {''.join(traceback.format_exception(e))[-900:]}")
            found.append(str(e).splitlines()[0] + " " + " ".join(str(e).splitlines()[1:3]))
    assert not found, f"{len(found)} of {total} points:\n" + "\n".join(found[:60])
