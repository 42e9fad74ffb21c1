# Runtime: the Python-visible surface of the engine, and the hooks other incr modules call
# (rt._demand, rt._read, rt._frames_swap, ... from incr._aio, incr.llmnodes, incr.remote,
# incr.collections). Methods here are thin: they check their arguments and state, then call
# the algorithms (module-level functions in the other parts, declared in _core.pxd).
#
# Contract:
#   - a public method that computes (demand through a cell call, stabilize, observe's value)
#     runs inside enter()/leave() (_core_demand.pxi): one thread computes on a runtime at a
#     time, and another thread's Input.set during it forms the next revision;
#   - nothing here changes the trace other than through those algorithms, so the invariants
#     of _core.pxd (checked by _check, _core_explain.pxi) hold whenever a method returns or
#     raises.


cdef class Runtime:
    """An incremental runtime: its inputs, the trace of its instances and their memo.

    >>> import incr
    >>> rt = incr.Runtime()
    >>> x = rt.input("x", 2)
    >>> @incr.cell
    ... def square():
    ...     return x.get() ** 2
    >>> with rt:
    ...     square()
    4
    """

    def __init__(self, store=None, *, hash="xxh3_128", max_workers=None, max_bytes=None,
                 executor=None, max_concurrency=None, durability="group", remote=None,
                 budget=None, on_failure=None, pass_budget=None):
        if durability not in ("group", "sync"):
            raise ValueError(f"Runtime: durability must be 'group' or 'sync', got "
                             f"{durability!r:.80}")
        if hash not in ("xxh3_128", "blake2b"):
            raise ValueError(f"Runtime: hash must be 'xxh3_128' or 'blake2b', got {hash!r}")
        if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes <= 0):
            raise ValueError(f"Runtime: max_bytes must be a positive int or None, got {max_bytes!r}")
        if max_workers is not None and (not isinstance(max_workers, int) or isinstance(max_workers, bool)
                                        or max_workers < 1):
            raise ValueError(f"Runtime: max_workers must be a positive int or None, got {max_workers!r}")
        if max_concurrency is not None and (not isinstance(max_concurrency, int)
                                            or isinstance(max_concurrency, bool)
                                            or max_concurrency < 1):
            raise ValueError(f"Runtime: max_concurrency must be a positive int or None, got "
                             f"{max_concurrency!r}")
        self.store_path = store
        self.hash = hash
        self.max_workers = max_workers
        self.max_concurrency = max_concurrency
        self.clock = 0
        self.revision = 0
        self.ts_clock = 0
        self.frame_ids = 0
        self.inputs = {}
        self.tables = {}
        self.frames = []
        self.dirty_observed = []
        self.unnotified = []
        self.quiet = -1
        self.busy_thread = 0
        self.busy_depth = 0
        self.forked_mid_run = None
        _runtimes.add(self)
        self.failed = {}
        self.report_log = None
        self.batch_depth = 0
        self.batch_bumped = False
        self.batch_thread = 0
        self.collecting = None
        self.stabilizing = False
        self.closed = False
        self.store = None
        self.llm = None
        self.extensions = {}
        self.prefetch = None
        self.ahead_marked = []
        self.inflight = {}
        self.awaiting = {}
        self.keep_failed = 0
        self.catching = 0
        self.pending_sets = []
        self.unwinding = []
        self.remote = None
        if executor is not None and not (callable(getattr(executor, "submit", None))
                                         and callable(getattr(executor, "results", None))):
            raise TypeError(f"Runtime: executor must have submit() and results() (see "
                            f"incr.adapters.dask and incr.adapters.ray), got {executor!r}")
        self.executor = executor
        if budget is not None or on_failure is not None or pass_budget is not None:
            # control across every LLM node of the runtime (incr.llmnodes checks the types)
            from incr import llmnodes as _llm
            _llm.configure(self, budget, on_failure, pass_budget)
        if remote is not None and store is None:
            raise ValueError("Runtime: remote= is a second tier of a store: pass store= too "
                             "(e.g. Runtime(store='.incr', remote='redis://host:6379/0'))")
        if store is not None:
            self.store = Store(store, max_bytes=max_bytes, durability=durability,
                               remote=remote)

    # -- the public surface ---------------------------------------------------------------

    def __enter__(self):
        check_usable(self)
        # the runtime active before, kept per context (each thread and asyncio task has its
        # own), so `with rt:` in several threads at once never mixes their stacks
        _outer.set(_outer.get() + (get_value(_active),))
        _active.set(self)
        return self

    def __exit__(self, *exc):
        cdef tuple outer = _outer.get()
        if not outer:
            raise IncrError("`with rt:` exited in another context than it was entered in")
        _active.set(outer[len(outer) - 1])
        _outer.set(outer[:len(outer) - 1])
        return False

    def input(self, str name, value=None):
        """Declare the input ``name`` with its first value. Names are unique within a runtime.

        Raises ValueError if ``name`` was declared before, TypeError if it is not a str,
        ReentrancyError inside a running cell (inputs are declared between computations).
        """
        check_usable(self)
        if self.frames and PyThread_get_thread_ident() == self.owner:
            raise ReentrancyError(self._reentrancy(f"declare input {name!r}"))
        if name in self.inputs:
            raise ValueError(f"input {name!r} is already declared on this runtime")
        if not name:
            raise ValueError("an input needs a non-empty name")
        i = Input(self, name, value)
        self.inputs[name] = i
        return i

    def input_map(self, str name, mapping=None):
        """A keyed input (incr.collections.InputMap): ``set(key, value)``, ``delete(key)``,
        ``update(mapping)`` as one revision; operators ``map``, ``filter``, ``join``,
        ``group_by`` and folds propagate per key. Same as ``incr.input_map(rt, name, mapping)``.
        """
        from incr import collections as _collections
        return _collections.InputMap(self, name, mapping)

    def batch(self):
        """A context manager: every ``set`` inside it forms one revision.

        A batch is not a transaction: if its body raises, the sets made before the exception
        stay (as one revision). Opened in a thread while another thread's pass runs, it
        collects its sets instead (its body still reads the old values) and applies them,
        as one revision, when it closes: after that pass, if it is still running (the
        pass never sees any of them). Such a batch whose body raises applies nothing.
        """
        check_usable(self)
        return _Batch(self)

    def _batch_open(self):
        """rt.batch()'s __enter__: this thread's collecting batch nests; a batch opened
        while another thread's pass runs collects (rt.collecting); else the sets are made
        at once inside _batch_enter's batch."""
        cdef unsigned long me = PyThread_get_thread_ident()
        st = None if self.collecting is None else self.collecting.get(me)
        if st is not None:
            (<list>(<list>st)[1]).append(len(<list>(<list>st)[0]))   # a nested batch's mark
            return
        if (deferring(self) and not self.closed
                and not (self.prefetch is not None and self.prefetch.is_worker())):
            # (nothing calls out between the test and the claim: no pass slips in)
            if self.collecting is None:
                self.collecting = {}
            self.collecting[me] = [[], [0]]
            return
        self._batch_enter()

    def _batch_close(self, bint raised):
        """rt.batch()'s __exit__: a collecting batch that raised drops what it collected
        since it opened; the outermost one applies the rest as one revision, queued after
        another thread's pass if one runs, else now with the runtime claimed (enter)."""
        cdef unsigned long me = PyThread_get_thread_ident()
        st = None if self.collecting is None else self.collecting.get(me)
        if st is None:
            self._batch_exit()
            return
        cdef list items = <list>(<list>st)[0]
        cdef list marks = <list>(<list>st)[1]
        cdef Py_ssize_t mark = marks.pop()
        if raised:
            del items[mark:]
        if marks:
            return
        del self.collecting[me]
        if not self.collecting:
            self.collecting = None
        if not items or self.closed:
            return
        op = _BatchOp(self, items)
        if deferring(self):
            self.pending_sets.append((None, op))   # (no call out since the test)
            return
        enter(self)
        try:
            apply_batch(self, items, False)
        finally:
            leave(self)

    def _batch_enter(self):
        # A batch opened with no other thread's pass running holds the runtime for its thread
        # until it closes (batch_thread): another thread's pass or demand meanwhile is refused
        # ('computing in another thread', other_busy) rather than seeing half the batch, and
        # another thread's sets are deferred to the revision after the batch's. (Not a claim
        # like enter(): this thread may close the runtime, or stabilize, inside its batch.)
        if self.frames:
            raise ReentrancyError(self._reentrancy("start a batch"))
        if self.batch_depth == 0:
            self.batch_thread = PyThread_get_thread_ident()
        self.batch_depth += 1

    def _batch_exit(self):
        self.batch_depth -= 1
        if self.batch_depth == 0:
            self.batch_bumped = False
            self.batch_thread = 0
            if self.pending_sets and not self.busy_depth and not self.closed:
                enter(self)     # other threads' sets made meanwhile: the next revision
                leave(self)

    def observe(self, cell, *args, **kwargs):
        """Observe one instance: ``stabilize()`` keeps it up to date and calls its callbacks.

        Registers and computes nothing: the next ``stabilize()`` computes every observed
        instance that is not up to date, independent ones concurrently (reading
        ``Observer.value`` first stabilizes). If its run raises, the instance is observed all
        the same: ``Observer.error`` holds the exception (``.value`` raises it), the next
        ``stabilize()`` runs it again, and the callbacks get its value once a run succeeds.
        Callbacks are called with every value the observer has not passed on yet, the first
        one included.
        """
        check_usable(self)
        if self.frames or self.stabilizing:
            raise ReentrancyError(self._reentrancy("observe an instance"))
        cdef Instance n = self._instance(cell, args, kwargs)
        if other_busy(self):
            raise IncrError(self._other_thread())
        o = Observer(self, n)
        if n.observed_by is None:
            n.observed_by = []
        n.observed_by.append(o)
        if _needs_work(n):
            self.dirty_observed.append(n)   # (I5) the next pass computes it
        else:
            self.unnotified.append(o)       # up to date already: the next pass passes it on
        return o

    def stabilize(self):
        """Bring every observed instance up to date in one pass, then call the callbacks of
        those whose value changed.

        Each stale instance runs at most once, dependencies before dependents, so none sees a
        mix of old and new values. Runtime complexity: O(instances made stale since the last
        stabilization).

        Raises the first exception an observed instance raised (after the others were brought
        up to date and the callbacks of those that succeeded were called; each observer of a
        failed instance keeps its exception in ``Observer.error``). Every callback runs even
        if one raises; their exceptions are raised together afterwards as an ExceptionGroup
        (with the instance's exception first, if there was one). Interrupted (Ctrl-C), it
        leaves every observed instance up to date or queued, and the callbacks it did not call
        to the next pass. From a thread other than the one computing: IncrError.
        """
        check_usable(self)
        if self.frames or self.stabilizing:
            raise ReentrancyError(self._reentrancy("stabilize"))
        if self.llm is not None and not self.busy_depth:
            # a stabilization begins (not a pass of rt.astabilize's, which holds the runtime):
            # its first pass announces itself
            self.llm.pass_open = False
        if self.llm is not None and (self.llm.spot or self.llm.halted
                                     or self.llm.pass_budget is not None):
            from incr import llmnodes as _llm
            if self.llm.pass_budget is not None and not self.catching:
                _llm.pass_reset(self)     # Runtime(pass_budget=): a stabilization begins
            if self.llm.spot or self.llm.halted:
                # LLM nodes with recheck_every= whose spot check is due are withdrawn
                # first; after rt.resume(), what met a halted node is made stale
                _llm.spot_checks(self)
        if _async_defined and not _loop_running() and not self.busy_depth:
            # async cells or calls may need to run: on this thread's event loop, concurrently
            return _aio_mod().drive(_aio_mod().astabilize(self))
        enter(self)
        try:
            return stabilize_pass(self)
        except _Suspend as s:
            if self.catching:
                raise
            _aio_mod().abandon(self, s.works)
            raise IncrError(_SUSPEND_MSG.format(what="an observed instance")) from None
        finally:
            leave(self)

    def explain(self, cell, *args, **kwargs):
        """Say why the instance's current value was computed, reused or cut off: which
        dependency changed, at which revision. Does not compute anything."""
        check_usable(self)
        cdef Instance n = self._instance(cell, args, kwargs, create=False)
        if n is None:
            return (f"{_label(<Cell>cell, (<Cell>cell).bound(args, kwargs))} has never been "
                    f"computed on this runtime")
        return _explain(self, n)

    def stats(self):
        """Cumulative counters since the runtime was created (the remote tier's: see
        incr.store.tier_stats)."""
        from incr.store import tier_stats
        return {
            "revision": self.revision,
            "inputs": len(self.inputs),
            "instances": sum(len(t) for t in self.tables.values()),
            "computed": self.n_computed,
            "recomputed": self.n_recomputed,
            "reused": self.n_reused,
            "cutoff": self.n_cutoff,
            "failed": self.n_failed,
            "store_hits": self.n_store_hits,
            "store_misses": self.n_store_misses,
            "generations": 0 if self.llm is None else self.llm.generations,
            "validations": 0 if self.llm is None else self.llm.validations,
            **tier_stats(self.store),
        }

    # -- LLM nodes (incr.llm does the work) --------------------------------------------------

    def state(self, node, *args, **kwargs):
        """The state of one LLM node instance: an incr.NodeState (candidate, revision,
        context_key, dependency_revisions, checks, status)."""
        check_usable(self)
        from incr import llmnodes as _llm
        if self.prefetch is not None and self.prefetch.is_worker():
            # a generator or validator of this pass, running ahead: the pass waits for it
            return _llm.state(self, node, args, kwargs)
        # claimed like any other operation: another thread's rt.nack/rt.ack or pass must not
        # change the node's ledger while it is read (IncrError while another thread has it)
        enter(self)
        try:
            return _llm.state(self, node, args, kwargs)
        finally:
            leave(self)

    def nack(self, node, *args, revision, case, counterexample=None, message="", **kwargs):
        """Record a NACK for candidate ``revision`` of node(*args). For the current revision
        the node is withdrawn at once (its readers become stale) and generates again, with
        the counterexample as feedback, at its next demand; for another revision it is
        history (and its counterexample a regression case)."""
        check_usable(self)
        from incr import llmnodes as _llm
        enter(self)   # one thread at a time: another thread's pass gets IncrError
        try:
            _llm.outside_verdict(self, node, args, kwargs,
                                 _llm.NACK(case, counterexample, message), revision, "nack")
        finally:
            leave(self)

    def ack(self, node, *args, revision, case, evidence=None, **kwargs):
        """Record an ACK for candidate ``revision`` of node(*args) (see nack)."""
        check_usable(self)
        from incr import llmnodes as _llm
        enter(self)
        try:
            _llm.outside_verdict(self, node, args, kwargs, _llm.ACK(case, evidence), revision,
                                 "ack")
        finally:
            leave(self)

    def halt(self, reason):
        """Stop every LLM loop on this runtime before its next model (generator) call, with
        incr.NotAccepted(reason="halted") whose report names ``reason`` (a non-empty str).
        Nothing partial is recorded. Only sets a flag: callable from any thread or a signal
        handler. Lasts until rt.resume()."""
        from incr import llmnodes as _llm
        _llm.halt(self, reason)

    def resume(self):
        """Allow model calls again after rt.halt(); the halted demands can simply be repeated."""
        from incr import llmnodes as _llm
        _llm.resume(self)

    def on_event(self, callback):
        """Subscribe ``callback(event)`` to the events of this runtime's LLM loops and passes
        (incr.events). Returns a function that unsubscribes."""
        from incr import llmnodes as _llm
        return _llm.on_event(self, callback)

    @property
    def halted(self):
        """The reason given to rt.halt() while halted, else None."""
        return self.halt_reason

    def astabilize(self):
        """``await rt.astabilize()``: ``stabilize()`` from async code (inside a running event
        loop). The async work of every observed instance (async cells, async generator and
        validator calls) runs concurrently as tasks on the running loop; sync generator calls
        run in threads as in ``stabilize()``. Same report, same errors."""
        check_usable(self)
        return _aio_mod().astabilize(self)

    async def aclose(self):
        """``await rt.aclose()``: ``close()`` from async code."""
        self.close()

    def close(self):
        """Flush and close the store, and close the runtime. Using it afterwards raises
        IncrError. Idempotent."""
        if self.closed:
            return
        if self.frames or self.stabilizing or self.busy_depth:
            if other_busy(self):
                raise IncrError(f"cannot close this incr.Runtime while another thread computes "
                                f"on it; close it from that thread, or once it has finished")
            raise ReentrancyError(self._reentrancy("close the runtime"))
        self.closed = True
        if self.store is not None:
            try:
                self.store.commit()
            finally:
                self.store.close()

    def __reduce__(self):
        raise TypeError("an incr.Runtime cannot be pickled or sent to another process; "
                        "cells and inputs travel as references (see incr.remote)")

    def __repr__(self):
        return (f"<incr.Runtime revision={self.revision} inputs={len(self.inputs)} "
                f"instances={sum(len(t) for t in self.tables.values())}>")

    # -- helpers for the Python layer -----------------------------------------------------

    def _demand_top(self, Instance n):
        """Demand ``n`` from outside any cell, with this runtime active."""
        check_usable(self)
        if get_value(_active) is self:
            return demand(self, n)
        token = _active.set(self)
        try:
            return demand(self, n)
        finally:
            _active.reset(token)

    def _instance(self, cell, tuple args, dict kwargs, bint create=True):
        if not isinstance(cell, Cell):
            raise TypeError(f"expected an incr cell, got {cell!r}")
        cdef Cell c = <Cell>cell
        return lookup(self, c, table_for(self, c), c.bound(args, kwargs), create)

    def _drop(self, Instance n):
        """Forget the instance ``n`` (incr.collections: the instance of a key that left a
        map): it leaves its cell's table and its dependencies' dependents, so it can be freed;
        a later call of the cell with those arguments makes a new one. Nothing is done (False)
        when something still reads it (dependents), observes it, or it is on the stack or
        running ahead now."""
        if n.rt is not self:
            raise ValueError(f"{n.label()} is not an instance of this runtime")
        if n.dependents or n.observed_by or n.flags & (F_RUNNING | F_VERIFYING | F_AHEAD):
            return False
        cdef dict table = self.tables.get(n.cell)
        if table is None:
            return False
        key = _fast_key(n.args)
        if key is None:
            try:
                key = normalize_args(n.cell.qualname_label, n.cell.param_names, n.args)
            except TypeError:
                key = None
        if key is None or table.get(key) is not n:
            # its own copy of the arguments keys differently from the caller's (a registered
            # type decoded to another): found by a scan of its cell's table
            for k, m in table.items():
                if m is n:
                    key = k
                    break
            else:
                return False
        del table[key]
        if n.cell.cached_inst is n:
            n.cell.cached_inst = None    # a zero-parameter cell's cached instance, dropped
        rewire(self, n, n.deps, [])
        n.flags = (n.flags & ~F_HAS_VALUE) | F_DIRTY
        n.value = None
        self.failed.pop(n, None)
        return True

    def _instances(self):
        """Every instance of the trace (for tests and tools)."""
        out = []
        for t in self.tables.values():
            out.extend(t.values())
        return out

    def _check(self):
        """Verify the trace's invariants (I1–I7 in _core.pxd). For tests: O(trace)."""
        return check(self)

    def _other_thread(self):
        return ("this incr.Runtime is computing in another thread; a runtime is used by one "
                "thread at a time (give each thread its own runtime, or wait for it)")

    def _reentrancy(self, what):
        if other_busy(self) or (self.frames and PyThread_get_thread_ident() != self.owner):
            # (another thread's pass, between its runs too: not this thread's stabilization)
            return self._other_thread()
        if self.frames:
            return (f"cannot {what} from inside the running cell "
                    f"{(<Frame>self.frames[-1]).node.label()}; changes happen between "
                    f"computations, not during them")
        return f"cannot {what} while the runtime is stabilizing"

    # -- hooks for incr.llm (internal) -----------------------------------------------------

    def _running(self):
        """The instance whose function runs now (innermost), or None."""
        if not self.frames:
            return None
        return (<Frame>self.frames[len(self.frames) - 1]).node

    def _reads(self):
        """The live list of nodes the running instance has read so far."""
        return (<Frame>self.frames[len(self.frames) - 1]).reads

    def _read(self, Node node):
        """Read ``node`` from the running instance: records the dependency, brings it up to
        date, returns its value (raises what it raises)."""
        if isinstance(node, Input):
            return (<Input>node).get()
        return demand(self, <Instance>node)

    def _stale(self, Instance n, bint held=False):
        """True when n would run (or be verified) at its next demand: not up to date. With
        held=True, only when it holds a value that something made stale (a change, or a
        withdrawal of what it read) -- not an instance loaded and not yet looked at."""
        if held:
            return (n.flags & (F_DIRTY | F_HAS_VALUE)) == (F_DIRTY | F_HAS_VALUE)
        return _needs_work(n)

    def _invalidate(self, Instance n, bint check=False):
        """Withdraw n's value (a NACK on it): n runs again at its next demand, never from
        the store, and everything that read it is stale, as after an input change. With
        check=True, only raise what withdrawing now would raise (ReentrancyError inside a
        computation), so that a caller can refuse before it changes anything."""
        check_usable(self)
        if self.frames or self.stabilizing:
            raise ReentrancyError(self._reentrancy(f"withdraw {n.label()}"))
        if not check:
            invalidate(self, n)

    def _halt_lifted(self, list insts):
        """rt.resume(), applied at the start of the next top-level operation: each of
        ``insts`` stopped at rt.halt, and what it raised (NotAccepted("halted")) rests on
        the halt, not on anything in the trace. So everything that met it -- a reader that
        failed with it, or caught it and returned something else -- is stale, as after an
        input change (a clock tick, dirtiness pushed), and the failures are no longer kept
        for the operation: each runs again at its next demand. False, changing nothing,
        while a computation or async work is in flight (a run that read the failure would
        be recorded clean after it): the caller tries again at the next operation."""
        cdef Instance n
        check_usable(self)
        if self.frames or self.stabilizing or self.inflight:
            return False
        self.clock += 1
        for n in insts:
            self.failed.pop(n, None)
            dirty_from(self, n)
        return True

    def _frames_swap(self, list frames):
        """Make ``frames`` the running stack (one asyncio task's); returns the previous one."""
        old = self.frames
        self.frames = frames
        return old

    def _frames(self):
        return self.frames

    def _run_start(self, Instance n):
        """Push n's frame on the running stack; returns (frame, had a value, was withdrawn)."""
        cdef int invalid = n.flags & F_INVALID
        cdef bint had = (n.flags & F_HAS_VALUE) != 0
        return run_begin(self, n), had, invalid, self.clock

    def _invoke(self, Instance n):
        return n.cell.invoke(_keys.own_args(n.args) if n.fresh_args else n.args)

    def _run_finish(self, Instance n, Frame f, bint had, value, long long start):
        run_finish(self, n, f, had, value, start)

    def _run_failed(self, Instance n, Frame f, bint had, int invalid, BaseException e):
        run_failed(self, n, f, had, invalid, e)

    def _pseudo_frame(self, Instance n):
        """A frame that records the reads of a call made for n (an async generator's or
        validator's), not pushed anywhere."""
        return new_frame(self, n)

    def _frame_info(self, Frame f):
        return f.node, f.reads

    def _enter(self):
        """Claim the runtime for this thread for an async operation (incr._aio)."""
        enter(self)

    def _leave(self):
        leave(self)

    def _quiet_swap(self, long long q):
        """Make ``q`` the untracked frame id (a task's own); returns the previous one."""
        cdef long long old = self.quiet
        self.quiet = q
        return old

    def _report_into(self, log):
        """Log the runs made from now on into ``log`` (a list), or stop (None): the report of
        rt.astabilize includes the runs its async work made between passes."""
        self.report_log = log

    def _keep_failed(self, int step):
        if step > 0 and self.keep_failed == 0:
            self.failed.clear()     # a new top-level async operation
        self.keep_failed += step

    def _demand(self, Instance n):
        return demand(self, n)

    def _has(self, Node n):
        return not _needs_work(n)

    def _gathering(self, int step):
        self.gathering += step

    def _lend(self, unsigned long ident):
        """Let thread ``ident`` compute for the running frame while its owner waits
        (validators with a timeout). Returns the previous owner, to give back."""
        cdef unsigned long old = self.owner
        self.owner = ident
        return old

    def _ikey(self, Instance n):
        """n's instance key in the store, or None (no store, or it cannot be stored)."""
        if self.store is None:
            return None
        cdef Persist p = n.persist
        if p is None:
            p = persist_of(self, n)
        return p.ikey if p.ok else None

    def _refs(self, nodes):
        """Store references [kind, ref, value hash] naming ``nodes``, or None if one cannot
        be named or hashed."""
        return refs(self, nodes)

    def _resolve_ref(self, ref):
        """The node a stored reference names in this process (computing nothing), or None."""
        cdef Cell c
        if type(ref) is not list or len(ref) != 3:
            return None
        if ref[0] == "i" and type(ref[1]) is str:
            return self.inputs.get(ref[1])
        if ref[0] != "c" or type(ref[1]) is not list or len(ref[1]) != 2:
            return None
        ident, args_b = ref[1]
        if type(ident) is not str or type(args_b) is not bytes:
            return None
        co = _keys.stored_cell(ident)
        if co is None:
            return None
        c = <Cell>co
        args = _stored_args(self, args_b)
        if args is None:
            return None
        try:
            return lookup(self, c, table_for(self, c), args, True)
        except TypeError:
            return None

    def _vhash(self, Node n):
        """n's content hash (b"" if it cannot be encoded)."""
        return value_hash(self, n)

    def _commit(self):
        """Commit what the store has buffered, durably whatever the durability (no-op in
        memory)."""
        if self.store is not None and not self.frames and not self.stabilizing:
            self.store.commit()

    def _store_node(self, bytes ikey):
        return self.store.node(ikey)

    def _store_put_node(self, bytes ikey, bytes record):
        self.store.put_node(ikey, record)

    def _hash_value(self, value):
        """The content hash a value would have here (b"" if it cannot be encoded)."""
        try:
            return _keys.digest("value", _keys.encode_value(value), self.hash)
        except TypeError:
            return b""

    def _input(self, str name):
        """The input declared as ``name``, or None."""
        return self.inputs.get(name)

    def _dep_info(self, Instance n):
        """(label, revision of its last change, content hash or None) per dependency of n."""
        out = []
        cdef Node d
        for d in n.deps:
            h = value_hash(self, d) if d.flags & F_HAS_VALUE else b""
            out.append((_node_label(d), d.changed_rev, h or None))
        return out


cdef void apply_batch(Runtime rt, list items, bint warn) except *:
    # A collecting batch's sets (and input maps' operations), as one revision of their own:
    # the batch counters of the runtime are set aside meanwhile (a batch open in another
    # thread does not absorb them). With warn (after another thread's pass: nobody to raise
    # to), a set that raises (its value's __eq__) is a RuntimeWarning and the rest are made.
    cdef int depth = rt.batch_depth
    cdef bint bumped = rt.batch_bumped
    cdef long long rev = rt.revision
    rt.batch_depth = 1
    rt.batch_bumped = False
    try:
        for inp, value in items:
            try:
                if inp is None:
                    value()
                else:
                    apply_set(rt, <Input>inp, value)
            except Exception as e:
                if not warn:
                    raise
                what = "a change" if inp is None else f"input {(<Input>inp).name!r}"
                _warnings.warn(f"incr: {what} of a batch made during the pass could not be "
                               f"made after it ({e!r}); make it again", RuntimeWarning)
    finally:
        rt.batch_depth = depth
        # a batch still open in another thread moves to a revision of its own at its next set
        rt.batch_bumped = bumped and rt.revision == rev


class _BatchOp:
    """A collecting batch's sets, queued in rt.pending_sets as one operation."""
    __slots__ = ("rt", "items")

    def __init__(self, rt, items):
        self.rt = rt
        self.items = items

    def __call__(self):
        apply_batch(self.rt, self.items, True)


cdef list cycle_labels(Runtime rt, Instance n, list stack, Instance m):
    # The labels of the cycle n -> ... -> n when n, on the stack, is demanded again: by the
    # innermost running frame (demand_cold: stack and m None), or as a dependency of m, the
    # top of ensure()'s verification ``stack`` (_core_verify.pxi). Walked forward from n: a
    # frame's node goes on to what it demanded (the next frame's node, through the
    # verification walk that frame started: its last reads, then walk_at), a node being
    # verified to the dependency it pushed (deps[walk_at]), the innermost frame to
    # ``stack``. None when the chain cannot be followed (the caller says less).
    cdef list frames = rt.frames
    cdef Py_ssize_t i, j, k, nf = len(frames)
    cdef Instance cur = n, end, x
    cdef list path = [n]
    cdef set seen = {n}
    cdef object nxt
    if m is not None:
        end = m
    elif nf:
        end = (<Frame>frames[nf - 1]).node
    else:
        return None
    while cur is not end:
        if stack is not None:
            for k in range(len(stack)):
                if stack[k] is cur:
                    path.extend(stack[k + 1:])
                    cur = end
                    break
            if cur is end:
                break
        i = -1
        for j in range(nf - 1, -1, -1):
            if (<Frame>frames[j]).node is cur:
                i = j
                break
        nxt = None
        if i == nf - 1:
            if not stack:
                return None
            nxt = stack[0]
        elif i >= 0:
            target = (<Frame>frames[i + 1]).node
            reads = (<Frame>frames[i]).reads
            for k in range(len(reads) - 1, -1, -1):
                x = reads[k] if isinstance(reads[k], Instance) else None
                if x is None:
                    continue
                if x is target:
                    nxt = x
                    break
                if x.flags & F_VERIFYING:
                    nxt = x
                    break
        elif cur.flags & F_VERIFYING and 0 <= cur.walk_at < len(cur.deps):
            nxt = cur.deps[cur.walk_at]
        if nxt is None or not isinstance(nxt, Instance) or nxt in seen:
            return None
        if not ((<Instance>nxt).flags & (F_VERIFYING | F_RUNNING)):
            return None
        cur = <Instance>nxt
        seen.add(cur)
        path.append(cur)
    path.append(n)
    return [(<Instance>x).label() for x in path]
