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
import os
import signal
import subprocess
import sys
import textwrap
import threading

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
