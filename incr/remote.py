"""Work that ``stabilize()`` runs ahead, concurrently: LLM generator calls in threads, and stale
cells on an executor (a Dask or Ray cluster: ``Runtime(executor=...)``). Internal.

How a pass uses it (see ``Runtime.stabilize``): the serial pass sets such work aside instead of
doing it (the instance is marked deferred; what reads it waits); between passes, everything set
aside runs at once; the next pass takes the results. The trace is only ever changed by the
thread running the pass.

A cell shipped to an executor runs its function on a worker against the values of the
dependencies its last run read, sent along with it. Cells and inputs travel as references
(``CellRef``, ``InputRef``): calling one on the worker returns the value the driver gave for it,
and records the read. A read of something not given stops the run ("missing"); the driver
brings that dependency up to date and sends the run again with the extra value — a restarting
scheduler. The result comes back with the list of reads; the driver replays the reads (they
become the instance's dependencies, exactly as in a local run, and must still be current) and
records the value in the trace and the store as a local run would.

Failures: an exception raised by the function travels back and is raised by the pass as if
the function had run locally. A failure of the executor itself (a worker killed, a lost
connection) makes the cell run locally instead, with one ``RuntimeWarning``.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import weakref
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from incr import keys as _keys
from incr.errors import CycleError, _Deferred, _OutOfTime

MAX_RESTARTS = 8

# -- on the worker ---------------------------------------------------------------------------

_ctx = threading.local()


class _Missing(Exception):
    def __init__(self, key: bytes):
        self.key = key


def _cell_key(ident: str, args: tuple) -> bytes:
    return b"c" + ident.encode() + b"\0" + _keys.encode(args)


def _input_key(name: str) -> bytes:
    return b"i" + name.encode()


def _lookup(key: bytes) -> Any:
    given = getattr(_ctx, "given", None)
    if given is None:
        raise RuntimeError("an incr cell or input reference can only be read inside a run "
                           "that incr sent to an executor")
    if key not in given:
        raise _Missing(key)
    _ctx.reads.append(key)
    return given[key]


class CellRef:
    """A cell, on a worker: calling it reads the value the driver gave for those arguments."""

    def __init__(self, name: str, ident: str, signature: Any):
        self.name = name
        self.ident = ident
        self.signature = signature

    def __call__(self, *args, **kwargs):
        if self.signature is not None:
            ba = self.signature.bind(*args, **kwargs)
            ba.apply_defaults()
            args = tuple(ba.arguments.values())
        return _lookup(_cell_key(self.ident, args))

    def __repr__(self):
        return f"<incr cell reference {self.name}>"


class InputRef:
    """An input, on a worker: ``get()`` reads the value the driver gave."""

    def __init__(self, name: str):
        self.name = name

    @property
    def _incr_input_name(self):
        return self.name

    def get(self):
        return _lookup(_input_key(self.name))

    def __repr__(self):
        return f"InputRef({self.name!r})"


def _live_read(n) -> None:
    """Input.get() of a live input inside a shipped run in this process (an executor that
    does not serialize: the function's globals are the driver's objects): recorded as a read
    of that input, as an InputRef's would be; the driver replays it (Ahead.take)."""
    name = getattr(n, "name", None)
    if isinstance(name, str) and type(n).__name__ == "Input":
        _ctx.reads.append(_input_key(name))


def run_remote(fn, signature, names, args, given):
    """Run one cell function on a worker. Returns (kind, payload, reads): ("ok", value),
    ("error", exception) or ("missing", key of the first read that was not given)."""
    _ctx.given, _ctx.reads = given, []
    try:
        if signature is None or len(names) == len(args) and all(
                p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                for p in signature.parameters.values()):
            value = fn(*args)
        else:
            import inspect
            ba = inspect.BoundArguments(signature, dict(zip(names, args)))
            value = fn(*ba.args, **ba.kwargs)
        return ("ok", value, _ctx.reads)
    except _Missing as m:
        return ("missing", m.key, _ctx.reads)
    except Exception as e:
        return ("error", e, _ctx.reads)
    finally:
        _ctx.given = _ctx.reads = None


# -- on the driver ---------------------------------------------------------------------------


class Ahead:
    """What one ``stabilize`` runs ahead of its serial passes (rt.prefetch)."""

    def __init__(self, rt):
        self.rt = rt
        self.collecting = True      # LLM generator and validator calls are set aside
        self.reading = False        # worker threads are running generators now
        self.pending: list = []     # (node state, key, call) set aside by incr.llmnodes
        self.wanted: list = []      # nodes not up to date that stopped calls running ahead
        self.idle = 0               # 1: the last round had nothing to run (ahead_round)
        # a round detached from its pass inside a running loop (astabilize): its claims
        # (RoundCall, one per instance) while their calls are in flight in worker threads
        self.detached: list = []
        self.pool = None
        self._local = threading.local()
        # executor runs: instance -> state
        self.tasks: dict = {}       # instance -> (given, keymap) waiting to be sent
        self.done: dict = {}        # instance -> (kind, payload, reads, keymap, stamps)
        self.extra: dict = {}       # instance -> nodes read beyond its last run's dependencies
        self.restarts: dict = {}
        self.local: set = set()     # instances to run here after an executor failure
        # plain cells lent to worker threads (a pass's ready observed instances, a gather's
        # thunks): instance -> (kind, payload, log, cells) of a finished worker run
        self.lent_done: dict = {}
        self.lendings: list = []    # the open _Lending objects (nested gathers: several)
        self.cond = threading.Condition()   # notified when a lent job finishes

    # -- generator calls (incr.llmnodes) ------------------------------------------------------

    def add(self, st, key, call, deadline=None) -> None:
        """Set ``call`` (no arguments) aside; its outcome goes to ``st.prefetched[key]``.
        Past ``deadline`` (time.monotonic()) it is not waited for: its outcome is
        incr.errors._OutOfTime, and whatever it returns later is never used."""
        # (the instance whose run set it aside: a detached round claims it, RoundCall; and
        # the CycleError a read of each instance on the stack now raises, _stack_cycles: a
        # serial call that reads one raises it there, so the call running ahead does too)
        from incr import _core
        inst = self.rt._running()
        cycles = _core._stack_cycles(self.rt, inst) if inst is not None else None
        self.pending.append((st, key, call, deadline, inst, cycles))

    def is_worker(self) -> bool:
        """True in a worker thread running a call set aside (not in any other thread)."""
        return getattr(self._local, "log", None) is not None

    def quiet(self, step: int) -> None:
        """incr.untracked in a worker thread: its reads are not logged (+1 enters, -1 leaves)."""
        self._local.quiet = getattr(self._local, "quiet", 0) + step

    def read(self, n) -> None:
        log = getattr(self._local, "log", None)
        if log is not None:
            if not getattr(self._local, "quiet", 0):
                log.append((n, n._changed_at))
        elif getattr(_ctx, "given", None) is not None:
            _live_read(n)

    def _wake(self, _future=None) -> None:
        with self.cond:
            self.cond.notify_all()

    def stop(self) -> None:
        self.collecting = False
        self.local.update(self.tasks)
        self.tasks.clear()

    # -- executor runs (the engine's attempt/run) --------------------------------------------

    def ship(self, m) -> int:
        """1: a result is ready (run() takes it); 0: set aside for the executor; 2: it read
        something it was not given (bring ``missing_node(m)`` up to date, then ask again);
        3: run it here."""
        if m in self.local or not self.collecting and m not in self.done:
            return 3
        out = self.done.get(m)
        if out is not None:
            kind, payload, reads, keymap, stamps = out
            if any(n._changed_at != at for n, at in stamps):
                del self.done[m]                 # what it was given moved on: send again
            elif kind == "missing":
                return 2
            else:
                return 1
        if m not in self.tasks:
            given, keymap = self._given(m)
            if given is None:
                return 3
            self.tasks[m] = (given, keymap)
        return 0

    def missing_node(self, m):
        """The node an executor run asked for and was not given; it will be given next time."""
        kind, key, reads, keymap, stamps = self.done.pop(m)
        self.restarts[m] = self.restarts.get(m, 0) + 1
        if self.restarts[m] > MAX_RESTARTS:
            self.local.add(m)
            return None
        node = self._resolve(key)
        if node is None:
            self.local.add(m)
            return None
        self.extra.setdefault(m, []).append(node)
        return node

    def take(self, m) -> Any:
        """Inside m's run: replay the reads of its executor run, or of its run in a worker
        thread (recording them), return its value or raise its exception."""
        rt = self.rt
        lent = self.lent_done.pop(m, None)
        if lent is not None:
            return _replay(rt, m, lent)
        kind, payload, reads, keymap, stamps = self.done.pop(m)
        for key in reads:
            n = keymap.get(key)
            if n is None and key[:1] == b"i":
                n = self._resolve(key)       # an input it read live (no serialization)
            if n is not None:
                rt._read(n)
        if kind == "error":
            raise payload
        return payload

    def _given(self, m):
        rt = self.rt
        given, keymap, stamps = {}, {}, []
        for d in list(m._deps) + self.extra.get(m, []):
            try:
                key = self._key(d)
            except TypeError:
                return None, None
            if key is None:
                return None, None
            if not d._has_value:
                continue                        # it failed: a read of it stops the run
            given[key] = d.value
            keymap[key] = d
        return given, keymap

    def _key(self, d) -> bytes | None:
        from incr._core import Input
        if isinstance(d, Input):
            return _input_key(d.name)
        ident = _keys.cell_identity(d.cell)
        if ident is None:
            return None
        return _cell_key(ident, tuple(d.args))

    def _resolve(self, key: bytes):
        rt = self.rt
        if key[:1] == b"i":
            return rt._input(key[1:].decode())
        ident, _, args = key[1:].partition(b"\0")
        cell = _keys.cell_for(ident.decode())
        if cell is None:
            return None
        try:
            args = _keys.decode(args)
        except _keys.DecodeError:
            return None
        try:
            return rt._instance(cell, tuple(args), {})
        except TypeError:
            return None

    # -- running what was set aside ------------------------------------------------------------

    def run(self) -> bool:
        """Run everything set aside, concurrently; False if there was nothing to run."""
        gens, self.pending = self.pending, []
        tasks, self.tasks = self.tasks, {}
        if not gens and not tasks:
            return False
        ex = self.rt.executor
        handles = []
        lost: list = []             # (instance, exception): they run in this process instead
        if tasks:
            for m, (given, keymap) in tasks.items():
                stamps = [(n, n._changed_at) for n in keymap.values()]
                cell = m.cell
                try:
                    h = ex.submit(run_remote, cell.fn, cell._signature, cell._param_names,
                                  tuple(m.args), given)
                except Exception as e:
                    lost.append((m, e))
                    continue
                handles.append((m, keymap, stamps, h))
        if gens:
            self._generate(gens)
        if handles:
            self.reading = True     # an executor that runs them in this process, without
            try:                    # serializing: their live Input.get() reads are recorded
                outs = ex.results([h for _m, _k, _s, h in handles])
            except Exception as e:  # the executor itself failed: run these here
                outs = [(False, e)] * len(handles)
            finally:
                self.reading = False
            for (m, keymap, stamps, _h), (ok, out) in zip(handles, outs):
                if not ok:
                    lost.append((m, out))
                    continue
                kind, payload, reads = out
                self.done[m] = (kind, payload, reads, keymap, stamps)
        if lost:
            self._lost(lost)
        return True

    def _lost(self, lost: list) -> None:
        """The executor could not run these: they run here, and one warning names them all."""
        for m, _e in lost:
            self.local.add(m)
        what = "; ".join(f"{m.label_text} ({type(e).__name__}: {e})" for m, e in lost)
        if len(lost) == 1:
            msg = f"incr: the executor could not run {what}; it runs in this process instead"
        else:
            msg = (f"incr: the executor could not run {len(lost)} cells: {what}; they run in "
                   f"this process instead")
        warnings.warn(msg, RuntimeWarning, stacklevel=3)

    def _call(self, item):
        """In a worker thread: make one call set aside, its reads logged. Returns (item,
        (outcome, reads, seconds), None), or (item, None, node) when it stopped at a read of
        a node not up to date (the driver may bring it up to date: wanted), or (item, None,
        None) when it could not run ahead at all (the serial pass makes it)."""
        fn = item[2]
        loc = self._local
        loc.log = []
        loc.stopped = None
        loc.cycles = item[5]
        loc.cycle_reads = []
        t0 = time.monotonic()
        try:
            out = fn()
        except _Deferred:
            # it read something not up to date: the driver brings that up to date
            # (ahead_wanted) and the call runs ahead again; else, the serial pass
            return item, None, loc.stopped
        except BaseException as e:        # kept, raised by the serial pass as if called there
            out = e
        finally:
            reads, loc.log = loc.log, None
            cycle_reads, loc.cycle_reads, loc.cycles = loc.cycle_reads, None, None
            loc.stopped = None
        if cycle_reads:
            # it read an instance on the driver's stack and met the CycleError a serial call
            # meets there: the run taking this outcome checks the read still would
            # (incr.llmnodes _ahead, _core._stack_cycles_hold)
            return item, (out, reads, time.monotonic() - t0, cycle_reads), None
        return item, (out, reads, time.monotonic() - t0), None

    def _outcomes(self, results) -> tuple:
        """Where the calls' outcomes go (st.prefetched); returns (stopped at a read: the
        nodes wanted, or None when some call could not run ahead at all)."""
        wanted = []
        serial = False
        for item, ahead, stopped in results:
            st, key = item[0], item[1]
            if ahead is not None:
                st.prefetched[key] = ahead
            elif stopped is None:
                serial = True
            elif stopped not in wanted:
                wanted.append(stopped)
        return None if serial else wanted

    def _generate(self, todo) -> None:
        workers = self.rt.max_workers or 4
        self.reading = True
        pool = ThreadPoolExecutor(max_workers=min(workers, len(todo)),
                                  thread_name_prefix="incr-generate")
        try:
            futures = [pool.submit(contextvars.copy_context().run, self._call, item)
                       for item in todo]
            results = []
            for f, item in zip(futures, todo):
                deadline = item[3]
                try:
                    results.append(f.result(None if deadline is None
                                             else max(0.0, deadline - time.monotonic())))
                except FutureTimeout:
                    # Budget(max_seconds) ran out with the call in flight: abandoned
                    results.append((item, (_OutOfTime(), [], time.monotonic()), None))
        finally:
            self.reading = False
            pool.shutdown(wait=False, cancel_futures=True)
        wanted = self._outcomes(results)
        if wanted is None:
            self.collecting = False           # what could not run ahead runs in the serial pass
        elif self.collecting:
            self.wanted = wanted              # brought up to date by ahead_round (the engine)

    # -- a round detached from its pass (inside a running event loop) -----------------------

    def detach(self):
        """The pass's round, inside ``await rt.astabilize()``: instead of waiting for the
        calls set aside on the loop's thread, start them in worker threads now and return one
        claim per instance (RoundCall), for the pass to unwind with (_Suspend): astabilize
        awaits them with the loop running, registered in rt.inflight as any async work, and
        passes again. Each claimed instance is marked running while its calls are in flight
        (as an async run in flight is), so another task that demands it waits for the claim
        instead of making the same call again (single flight). None (nothing started) when
        a call has no instance to claim."""
        from incr import _core
        items = self.pending
        groups: dict = {}
        for item in items:
            if item[4] is None:
                return None
            groups.setdefault(item[4], []).append(item)
        self.pending = []
        self.collecting = False       # nothing more is set aside on this Ahead
        self.reading = True           # its workers' reads are logged until the last claim ends
        workers = self.rt.max_workers or 4
        pool = self.pool = ThreadPoolExecutor(max_workers=min(workers, len(items)),
                                              thread_name_prefix="incr-generate")
        works = []
        for inst, its in groups.items():
            futs = [pool.submit(contextvars.copy_context().run, self._call, item)
                    for item in its]
            _core._round_claim(self.rt, inst, True)
            works.append(RoundCall(self, inst, its, futs))
        self.detached = list(works)
        return works

    def carry(self) -> None:
        """A pass begins: what the last detached round of this runtime left for it -- the
        nodes its calls stopped at (brought up to date first: ahead_wanted), or that some
        call could not run ahead at all (this pass is serial, as the round's own pass would
        have been)."""
        left = _carried.pop(self.rt, None)
        if left is None:
            return
        if left[0]:
            self.collecting = False
        elif left[1]:
            self.wanted = list(left[1])


_carried: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # rt -> (serial, wanted)


async def _threads_done(futs) -> None:
    """Wait until every one of ``futs`` (concurrent futures of calls in worker threads) is
    done or cancelled, whatever cancels the waiter meanwhile."""
    for f in futs:
        f.cancel()                  # (a call not started yet is never made)
    while True:
        left = [f for f in futs if not f.done()]
        if not left:
            return
        try:
            await asyncio.wait([asyncio.wrap_future(f) for f in left])
        except asyncio.CancelledError:
            continue


class RoundCall:
    """One instance's calls of a detached round (Ahead.detach): work for incr._aio.do_works,
    keyed by the instance (rt.inflight), so that a second demander waits on it. ``drop``
    ends the claim (when its calls are done, cancelled, or the work is abandoned)."""

    __slots__ = ("ahead", "inst", "items", "futs", "key", "claimed")
    claim = True

    def __init__(self, ahead, inst, items, futs):
        self.ahead = ahead
        self.inst = inst
        self.items = items
        self.futs = futs
        self.key = inst
        self.claimed = True

    async def do(self, rt) -> None:
        try:
            results = []
            try:
                for f, item in zip(self.futs, self.items):
                    w = asyncio.wrap_future(f)
                    deadline = item[3]
                    if deadline is None:
                        results.append(await w)
                        continue
                    done, _ = await asyncio.wait([w],
                                                 timeout=max(0.0, deadline - time.monotonic()))
                    if done:
                        results.append(w.result())
                    else:   # Budget(max_seconds) ran out with the call in flight: abandoned
                        w.cancel()
                        results.append((item, (_OutOfTime(), [], time.monotonic()), None))
            except asyncio.CancelledError:
                # its last waiter is gone (a cancelled astabilize): the calls not started are
                # cancelled; those running in a thread cannot be stopped, and no call
                # outlives the cancellation -- it waits for them, their outcomes dropped
                # (cancellation records nothing), the claim held until they end
                await _threads_done(self.futs)
                raise
            wanted = self.ahead._outcomes(results)
            serial, prev = wanted is None, _carried.get(rt)
            if prev is not None:
                serial = serial or prev[0]
                wanted = (prev[1] or []) + [n for n in (wanted or ()) if n not in prev[1]]
            if serial or wanted:
                _carried[rt] = (serial, wanted or [])
        finally:
            self.drop(rt)

    def drop(self, rt) -> None:
        if not self.claimed:
            return
        self.claimed = False
        from incr import _core
        _core._round_claim(rt, self.inst, False)
        a = self.ahead
        if self in a.detached:
            a.detached.remove(self)
        if not a.detached:
            a.reading = bool(a.lendings)
            if a.pool is not None:
                a.pool.shutdown(wait=False, cancel_futures=True)
                a.pool = None
            if rt.prefetch is a and not a.lendings:
                rt.prefetch = None


# -- lending: plain sync cells in worker threads (_core_schedule.pxi) ------------------------

_pool = None
_pool_lock = threading.Lock()
POOL_THREADS = 32      # shared by every runtime; each lends at most max_workers - 1 at once


def _shared_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=POOL_THREADS, thread_name_prefix="incr-cell")
        return _pool


def _forget_pool() -> None:      # in a fork()ed child the parent's threads do not exist
    global _pool, _pool_lock
    _pool = None
    _pool_lock = threading.Lock()


if hasattr(__import__("os"), "register_at_fork"):
    __import__("os").register_at_fork(after_in_child=_forget_pool)


def _replay(rt, m, out) -> Any:
    """Inside m's run (driver thread): record the reads a worker's run of m made, in order,
    through the ordinary read path (a first computation the worker made is taken the same
    way), then return its value or raise its exception."""
    from incr import _core
    kind, payload, log, cells = out
    for n, at in log:
        if at == -1 or at is None and cells[n][0] != "ok":
            try:
                rt._read(n)          # it raised in the worker too, and m's function caught it
            except Exception:
                pass
        else:
            rt._read(n)
    for n, at in log:
        if at is None and cells[n][0] == "ok" and not _core._lend_same(n.value, cells[n][1]):
            # a first computation the worker made came out otherwise here (a function that
            # is not deterministic): m's worker run does not stand; it runs here now (its
            # replayed reads stay recorded: a superset of its dependencies is safe)
            return _core._lend_invoke(m)
    if kind == "error":
        raise payload
    return payload


class _Lending:
    """Jobs lent to worker threads by one pass round or one incr.gather: instances (their
    run) or thunks. At most ``cap`` in flight; the driver takes them in order."""

    def __init__(self, ahead, jobs, thunks: bool, own: bool, cap: int):
        self.ahead = ahead
        self.jobs = list(jobs)
        self.thunks = thunks
        self.own = own
        self.cap = max(1, cap)
        self.futures: dict = {}      # job index -> Future
        self.skipped: set = set()    # job indices the driver did itself (never sent)
        self.next = 0
        self.index = {} if thunks else {m: i for i, m in enumerate(self.jobs)}
        self.ctx = contextvars.copy_context()
        self.taken: list = []        # instances registered in rt.lent by this lending
        self.closed = False
        self.boxes: dict = {}        # job index -> _Box (what its worker waits for)
        self.outcomes: dict = {}     # job index -> its outcome, once the driver waited for it

    def top_up(self) -> None:
        busy = sum(1 for f in self.futures.values() if not f.done())
        pool = None
        while self.next < len(self.jobs) and busy < self.cap:
            i = self.next
            self.next += 1
            if i in self.skipped:
                continue
            if pool is None:
                pool = _shared_pool()
            job = self.jobs[i]
            box = self.boxes[i] = _Box(self, i)
            f = self.futures[i] = pool.submit(self.ctx.copy().run, self.ahead._job, job,
                                              self.thunks, box)
            f.add_done_callback(self.ahead._wake)
            busy += 1

    def wait(self, i: int):
        """Job i's outcome (kind, payload, log, cells), waiting for it; None when it was never
        sent (the driver does it now, and it is never sent)."""
        out = self.outcomes.get(i)
        if out is not None:
            return out
        f = self.futures.get(i)
        if f is None:
            self.skipped.add(i)
            return None
        self.top_up()
        out = self.ahead._await(f)   # (interrupted: close() still waits)
        del self.futures[i]
        self.outcomes[i] = out
        self.top_up()
        self._merge(out[3])
        return out

    def _merge(self, cells: dict) -> None:
        # first computations a worker made: each becomes takeable by the driver's attempt()
        ahead, rt = self.ahead, self.ahead.rt
        for n, (kind, payload, log) in cells.items():
            if n in ahead.lent_done or not rt._stale(n) or n._has_value:
                continue
            ahead.lent_done[n] = (kind, payload, log, cells)
            if n not in rt.lent:
                rt.lent[n] = self
                self.taken.append(n)

    def finish(self) -> list:
        """Cancel the jobs not started, wait for the others (no worker outlives the round or
        gather); returns the lent instances whose job finished, not yet taken."""
        for f in list(self.futures.values()):
            f.cancel()
        done = []
        for i, f in list(self.futures.items()):
            if f.cancelled():
                continue
            try:
                out = f.result()
            except BaseException:   # noqa: BLE001 -- a job's own errors are outcomes
                continue
            self._merge(out[3])
            if not self.thunks:
                done.append(self.jobs[i])
        return done

    def close(self) -> None:
        """Wait for every job still running (finish), then drop what the driver did not
        take."""
        if self.closed:
            return
        self.closed = True
        ahead, rt = self.ahead, self.ahead.rt
        try:
            self.finish()
        finally:
            self.futures.clear()
            lent = rt.lent
            for m in (self.taken if self.thunks else self.jobs + self.taken):
                ahead.lent_done.pop(m, None)
            if lent is not None:
                for m, v in list(lent.items()):
                    if v is self or isinstance(v, _Box) and v.lending is self:
                        del lent[m]
                        ahead.lent_done.pop(m, None)
            if self in ahead.lendings:
                ahead.lendings.remove(self)
            if not ahead.lendings and not ahead.detached:
                ahead.reading = False     # (a detached round's workers still read: RoundCall)


def _lend(self, jobs, thunks: bool, own: bool) -> _Lending:
    """Lend ``jobs`` (instances, or a gather's thunks) to worker threads: at most
    max_workers - 1 in flight (the driver is the other worker)."""
    workers = self.rt.max_workers or 4
    lending = _Lending(self, jobs, thunks, own, workers - 1)
    self.lendings.append(lending)
    self.reading = True
    if not thunks:
        for m in lending.jobs:
            self.rt.lent[m] = lending
    lending.top_up()
    return lending


def _lent_result(self, m):
    """attempt() for m, which was lent or computed by a worker: its outcome, waiting for its
    job if it is in flight; None when it must run here (it stopped, or was never sent)."""
    out = self.lent_done.get(m)
    if out is not None:
        return out
    lending = self.rt.lent.pop(m, None)
    if isinstance(lending, _Box):       # a first computation a worker's job claimed
        box = lending
        fut = box.lending.futures.get(box.index)
        if fut is not None:
            self._await(fut, lambda: m in self.lent_done)
        if m not in self.lent_done:
            box.lending.wait(box.index)
        return self.lent_done.get(m)
    if lending is None or lending.thunks:
        return None
    i = lending.index.get(m)
    if i is None:
        return None
    got = lending.wait(i)
    if got is None or got[0] == "missing":
        return None
    kind, payload, log, cells = got
    own = cells.get(m)
    if own is None:
        return None
    out = (own[0], own[1], own[2], cells)
    self.lent_done[m] = out
    return out


def _job(self, job, thunk: bool, box=None):
    """In a worker thread: run one lent job with its reads logged. Returns (kind, payload,
    log, cells): kind "ok", "error" or "missing" (it read something it may not compute, and
    stopped); log the job's own reads, (node, change tick) or (node, None) for a first
    computation it made, whose outcome is cells[node] = (kind, payload, log)."""
    loc = self._local
    loc.log, loc.cells, loc.running, loc.stops, loc.box = [], {}, set(), 0, box
    try:
        try:
            if thunk:
                out = ("ok", job())
            else:
                got = self._nested(job)
                out = ("ok", None) if got is not None else ("missing", None)
        except _Deferred:
            out = ("missing", None)
        except BaseException as e:      # raised by the pass as if run there
            out = ("error", e)
        if loc.stops:                   # a stop the function caught: its result rests on it
            out = ("missing", None)
        return out[0], out[1], loc.log, loc.cells
    finally:
        loc.log = loc.cells = loc.running = loc.box = None
        loc.stops = 0
        loc.quiet = 0


def _nested(self, n):
    """In a worker thread: compute n (a first computation it may make) with its own log;
    its outcome ("ok", value) or ("error", exception) goes to cells[n] and is returned.
    None when the run stopped and caught it (nothing recorded); a stop that escapes the
    function propagates (_Deferred)."""
    from incr import _core
    loc = self._local
    parent = loc.log
    stops = loc.stops
    loc.log = []
    loc.running.add(n)
    try:
        try:
            value = _core._lend_invoke(n)
            if hasattr(value, "__await__"):
                if hasattr(value, "close"):
                    value.close()
                loc.stops += 1        # a coroutine: the driver's own run says what is wrong
                raise _Deferred(n.label_text)
            got = ("ok", value)
        except _Deferred:
            loc.stops += 1
            raise
        except BaseException as e:    # (KeyboardInterrupt too: the driver raises it there)
            got = ("error", e)
    finally:
        log, loc.log = loc.log, parent
        loc.running.discard(n)
    if loc.stops != stops:
        return None                   # it read something it may not compute and caught that
    loc.cells[n] = (got[0], got[1], log)
    lent = self.rt.lent
    if lent is not None and loc.box is not None and lent.get(n) is loc.box:
        # a first computation it claimed: takeable at once (the driver may be waiting)
        self.lent_done.setdefault(n, (got[0], got[1], log, loc.cells))
        self._wake()
    return got


def _worker_demand(self, n):
    """demand() in a worker thread of n, which is not up to date. A lent cell's run (or a
    gather's thunk) computes it here when it is a first computation nothing else runs; reads
    the failure of one that failed in this pass; and otherwise (a stale instance, one running
    in the driver or lent, an LLM node, an async cell) -- and for every read of an LLM
    generator running ahead -- stops the run (_Deferred): the driver runs it again itself."""
    from incr import _core
    loc = self._local
    cells = getattr(loc, "cells", None)
    if cells is None:                       # an LLM generator or validator running ahead:
        cycles = getattr(loc, "cycles", None)
        if cycles is not None and n in cycles:
            # n was on the driver's stack when the call was set aside: the serial call's
            # read raises this CycleError (demand_cold); so does this one, and the call
            # goes on as the serial one would (its read of n not logged, as no edge into a
            # cycle is recorded)
            loc.cycle_reads.append((n, cycles[n]))
            raise CycleError(list(cycles[n]))
        loc.stopped = n                     # the driver may bring n up to date (wanted)
        raise _Deferred(n.label_text)
    got = cells.get(n)
    if got is None:
        if n in loc.running:                # a cycle: the driver's own run names it
            loc.stops += 1
            raise _Deferred(n.label_text)
        state = _core._lend_state(self.rt, n)
        if state == 0 and not _core._lend_claim(self.rt, n, loc.box):
            state = _core._lend_state(self.rt, n)     # claimed meanwhile by another thread
            if state == 0:
                state = 2
        if state == 0:
            got = self._nested(n)
            if got is None:
                loc.stops += 1
                raise _Deferred(n.label_text)
        elif state == 3:                    # up to date now
            value = n.value
            self.read(n)
            return value
        elif state == 4:                    # failed in this pass: raised, as at a local read
            if not getattr(loc, "quiet", 0):
                loc.log.append((n, -1))
            raise _core._lend_failure(self.rt, n)
        else:
            loc.stops += 1
            raise _Deferred(n.label_text)
    if not getattr(loc, "quiet", 0):
        loc.log.append((n, None))
    if got[0] == "error":
        raise got[1]
    return got[1]


def _await(self, fut, until=None):
    """Driver thread: wait for a lent job to finish (its outcome), or until ``until()``
    holds (None)."""
    with self.cond:
        while not fut.done() and not (until is not None and until()):
            self.cond.wait(0.05)
    if fut.done():
        return fut.result()
    return None


class _Box:
    """One lent job: its lending and index. Also the value of rt.lent for a first
    computation its worker claimed (the driver then waits for it)."""
    __slots__ = ("lending", "index")

    def __init__(self, lending, index):
        self.lending = lending
        self.index = index


Ahead.lend = _lend
Ahead.lent_result = _lent_result
Ahead._job = _job
Ahead._nested = _nested
Ahead.worker_demand = _worker_demand
Ahead._await = _await
