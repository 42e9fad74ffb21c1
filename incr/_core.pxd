# The data model of incr's engine: read this file first. It is the table of contents of the
# engine (incr/_core.pyx and the parts it includes, incr/_core_*.pxi): every class's fields,
# the invariants, and -- at the end -- every algorithm function with the file that holds it.
#
# A Runtime owns a trace: Inputs and Instances (one per cell and set of arguments), linked by
# the dependencies each instance read on its last run (`deps`) and the reverse edges
# (`dependents`). Time is counted twice: `clock` ticks on every change and every verification
# (it decides staleness), `revision` is the public count of committed changes (one per `set`
# outside a batch, one per batch).
#
# Invariants (checked by Runtime._check(); tests call it, production code never does):
#   I1  an instance that has a value and is not dirty has no dirty dependency (dirtiness is
#       pushed to every dependent, transitively, when an input changes; an instance without a
#       value runs at its next demand whatever its dependencies, so an interrupted
#       verification may leave one with a dirty dependency);
#   I2  an instance that is clean (not dirty, has a value) has, for every dep d,
#       d.changed_at <= verified_at;
#   I3  `dependents` is exactly the reverse of `deps`, as multisets;
#   I4  timestamps order the trace: every dep d of n has d.ts < n.ts;
#   I5  an observed instance that is dirty or has no value is in Runtime.dirty_observed;
#   I6  outside a running computation no instance is RUNNING and the frame stack is empty
#       (an async run in flight -- in Runtime.inflight -- is RUNNING between its steps);
#       outside a pass no instance is F_AHEAD;
#   I7  a clean instance holds no value computed from a dependency revision that has since been
#       withdrawn or changed without it being verified again. For plain cells that is I1+I2;
#       an LLM node's candidate also rests on evidence: its state (incr.llmnodes) records, for
#       each verdict on the current revision, what the run had read before it (and, for a node
#       with nothing to validate with, what the candidate's generation read), with the tick of
#       each; a clean LLM node is `stable`, holds that candidate, and none of those ticks moved
#       (llmnodes._evidence is the hook).

from incr._codec cimport Record
from cpython.object cimport PyObject


cdef enum NodeFlag:
    F_DIRTY = 1        # a dependency may have changed since verified_at: verify before use
    F_HAS_VALUE = 2    # `value` holds the result of a successful run
    F_RUNNING = 4      # its function is on the call stack now
    F_VERIFYING = 8    # on an explicit verification stack now
    F_INPUT = 16       # an Input (always clean; changed_at moves on set)
    F_MUST_RUN = 32    # found stale during a deep verification; runs once its deps are ready
    F_INVALID = 64     # withdrawn by evidence (a NACK): runs again, never taken from the store
    F_AHEAD = 128      # its run runs ahead this pass (an executor or a worker thread does
                       # the work; _core_schedule.pxi) or it waits for such a dependency: it
                       # keeps its value, dependencies and stamps and is handed to no reader;
                       # cleared between rounds and at the end of the pass


cdef class Node:
    cdef readonly object value       # read-only from Python (Input.set changes an input)
    cdef long long changed_at        # clock tick of the last change of `value`
    cdef long long changed_rev       # public revision of that change
    cdef long long ts                # trace timestamp (I4)
    cdef int flags                   # NodeFlag bits
    cdef list dependents             # Instances that read this node on their last run, or None
    cdef long long read_stamp        # id of the last frame that recorded a read of this node
    cdef Runtime rt
    cdef object vhash                # content hash of `value` (store only): None = not computed,
                                     # b"" = the value cannot be encoded


cdef class Input(Node):
    cdef readonly str name
    cdef object shadow               # (own copy,) of a mutable value, else None: what a set
                                     # is compared with (mutating the value changes nothing)


cdef class Instance(Node):
    cdef readonly Cell cell
    cdef readonly tuple args         # bound positional arguments, defaults applied: the
                                     # instance's own copy (never the caller's objects)
    cdef bint fresh_args             # args hold mutable parts: each run gets a fresh copy
    cdef int walk_at                 # on a verification stack: the next of `deps` ensure()
                                     # checks; 0 when on none (_core_verify.pxi). (An int
                                     # beside fresh_args: it fills their 8-byte slot, so the
                                     # instance is no bigger than without it)
    cdef tuple deps                  # nodes read on the last run, in read order
    cdef long long verified_at       # clock tick at which it was last known up to date
    cdef long long ran_rev           # public revision of its last run
    cdef Node why                    # the dependency whose change caused the last run, or None
    cdef list observed_by            # live Observers on it, or None
    cdef int last_action             # A_* below: what happened at its last verification
    cdef Persist persist             # its persistent identity (store only), or None

    cdef str label(self)


cdef class Persist:
    # An instance's persistent identity, and the state of a store lookup in progress.
    # Not tracked by the cyclic collector (cands and resolved are None outside a lookup).
    cdef bint ok                     # False: this instance is never stored
    cdef bytes ikey                  # instance key: hash of (cell identity, canonical arguments)
    cdef str ident                   # the cell's identity
    cdef bytes args                  # canonical encoding of the bound arguments
    cdef list cands                  # stored Records being tried, or None when no lookup runs
    cdef Py_ssize_t ci, di           # candidate and dependency being checked
    cdef bytes node                  # the index node reached by the lookup, None once the
                                     # entry is found (or no lookup runs)
    cdef list resolved               # dependencies of the candidate resolved so far (the last
                                     # may be one pushed for verification, not yet checked)
    cdef str miss                    # explain: the label of the dependency whose value hash
                                     # no stored run had, at the last lookup's miss (or None:
                                     # found, or nothing stored); a label, not the node (no
                                     # cycle through this untracked object)


# Record (a checked stored record, held undecoded) and the codec's helpers: incr/_codec.pxd.


cdef enum Action:
    A_NONE = 0
    A_COMPUTED = 1     # first run
    A_RECOMPUTED = 2   # ran again, value changed
    A_CUTOFF = 3       # ran again, value equal to the old one: dependents not disturbed
    A_REUSED = 4       # verified without running
    A_FAILED = 5       # last run raised
    A_LOADED = 6       # taken from the store: its dependencies hash as when it was stored


cdef class Cell:
    cdef object __weakref__
    cdef dict __dict__               # functools-style attributes: __name__, __doc__, __wrapped__
    cdef public str qualname_label   # the function's __qualname__, used in labels
    cdef readonly object fn
    cdef readonly str name           # module-qualified name, for labels and identity
    cdef readonly object version
    cdef readonly object cutoff
    cdef int cutoff_kind             # C_* below
    cdef tuple param_names
    cdef object signature            # inspect.Signature, for binding keyword arguments
    cdef int n_positional            # parameters that can be passed positionally, no *args
    cdef bint simple                 # all parameters positional-or-keyword, no defaults, no */**
    cdef readonly bint is_async      # an async def: runs on an event loop (incr._aio)
    cdef public bint awaited         # calling it from async code returns an awaitable (an
                                     # async cell; an incr.llm node with async calls)
    cdef public bint is_llm          # an incr.llm node: adoption from the store asks incr.llmnodes
    cdef public bint local           # never shipped to an executor (Runtime(executor=...))
    cdef public bint is_effect       # an @incr.effect: what it reads must rest on stable LLM
                                     # nodes only (demand_for_effect, _core_demand.pxi)
    cdef Runtime cached_rt           # the runtime whose table was looked up last
    cdef dict cached_table
    cdef Instance cached_inst        # a zero-parameter cell's one instance in cached_rt, or
                                     # None (set by the first call there; Runtime._drop, the
                                     # one way out of a table, clears it)
    cdef void *vectorcall            # the vectorcall entry (_cell_vectorcall) for a plain
                                     # Cell; NULL for subclasses (they may override __call__)

    cdef object call(self, tuple args, dict kwargs)
    cdef object call_slow(self, Runtime rt, Instance n)

    cdef tuple bound(self, tuple args, dict kwargs)
    cdef tuple bind(self, tuple args, dict kwargs)
    cdef object invoke(self, tuple args)


cdef enum CutoffKind:
    C_EQUAL = 0
    C_IDENTITY = 1
    C_NEVER = 2
    C_CALLABLE = 3


cdef class Stabilization:
    # The report of one stabilize pass (incr.Stabilization; fields public, as they were when it
    # was a Python class: incr._aio prepends the runs of an async stabilization's earlier
    # passes to _log and sets seconds)
    cdef public list _log            # (instance, action) in run order
    cdef public object _labels       # [(label, action)], built when first read, or None
    cdef public long long reused     # count of instances verified without running
    cdef public double seconds       # the pass's duration
    cdef public long long revision   # rt.revision at its end


cdef class Observer:
    cdef readonly Runtime runtime
    cdef Instance node
    cdef list callbacks
    cdef long long seen_at           # changed_at of the value last passed to the callbacks
    cdef bint active
    cdef readonly object error       # the exception of the instance's last run, or None


cdef class Frame:
    cdef Instance node
    cdef list reads                  # nodes read so far by this run
    cdef long long id
    cdef Frame next_free             # the next frame in Runtime.free_frames (pooled), or None


cdef class Runtime:
    cdef object __weakref__
    cdef long long clock
    cdef readonly long long revision
    cdef long long ts_clock
    cdef long long frame_ids
    cdef dict inputs                 # name -> Input
    cdef dict tables                 # Cell -> {argument key -> Instance}
    cdef list frames                 # running computations, innermost last; a sync run pushes
                                     # and pops it without shrinking its item array
                                     # (frames_push/frames_pop, _core_execute.pxi)
    cdef Frame free_frames           # frames of finished sync runs that nothing else holds,
                                     # linked through next_free, their reads empty (reused by
                                     # run(): no allocation per run)
    cdef list spare_stack            # the empty stack of the last ensure() that returned, or
                                     # None (_core_verify.pxi)
    cdef unsigned long owner         # the thread that pushed the outermost frame
    cdef list dirty_observed         # observed instances made dirty since the last stabilize
    cdef list unnotified             # Observers whose callbacks an interrupt kept from running
    cdef long long quiet             # id of the frame whose reads are not recorded (untracked)
    cdef unsigned long busy_thread   # the thread in a top-level demand or stabilize, or 0
    cdef int busy_depth
    cdef str forked_mid_run          # set in a fork()ed child when another thread of the
                                     # parent was computing on it: the runtime is unusable
    cdef dict failed                 # Instance -> exception, for the current pass only
    cdef int batch_depth
    cdef bint batch_bumped
    cdef unsigned long batch_thread  # the thread of the open batch made at once (no pass ran
                                     # when it opened), or 0: other threads' passes and demands
                                     # are refused meanwhile, their sets deferred (other_busy)
    cdef dict collecting             # thread ident -> [items, marks]: rt.batch() opened in a thread
                                     # while another thread's pass ran collects its sets (items as
                                     # in pending_sets) and applies them as one revision when it
                                     # closes; None when no thread collects (_core_runtime.pxi)
    cdef bint stabilizing
    cdef readonly bint closed
    cdef list report_log             # (label, action) appended during a stabilize, or None
    cdef readonly object store_path
    cdef object store                # incr.store.Store, or None (in memory)
    cdef long long n_store_hits, n_store_misses
    cdef readonly str hash
    cdef readonly object max_workers
    cdef readonly object max_concurrency   # async model calls (generators, validators) in
                                           # flight at once, or None (no limit)
    cdef public object llm           # incr.llmnodes' bookkeeping for this runtime, or None
    cdef public object halt_reason   # rt.halt(reason) until rt.resume(), else None: LLM loops
                                     # stop before their next generator call (incr.llmnodes)
    cdef readonly dict extensions    # per-runtime state of adapters (incr.adapters.*), by name
    cdef public object prefetch      # the incr.remote.Ahead of the pass (or top-level gather) that
                                     # runs work ahead, else None (_core_schedule.pxi)
    cdef readonly object executor    # runs stale cells elsewhere (incr.adapters.dask/ray), or None
    cdef list ahead_marked           # instances marked F_AHEAD in this pass
    cdef Instance remote             # the instance whose run takes an executor's result now
    cdef public dict lent            # instance -> its lending (incr.remote): a run a worker thread
                                     # does or did in this pass or gather, taken by attempt();
                                     # None when nothing is lent (_core_schedule.pxi)
    cdef public dict inflight        # key -> asyncio.Future: async work in flight (incr._aio):
                                     # an async instance's run, or a call (single flight)
    cdef public dict awaiting        # instance -> keys of the work its task awaits (cycles
                                     # across tasks are found by walking this)
    cdef public list unwinding       # incr._aio work started and unwinding to an await (a run
                                     # that returns while it grows swallowed the unwinding)
    cdef list pending_sets           # (Input, value) set by other threads during a pass: the
                                     # next revision, applied by leave() in order; (None, op):
                                     # op() called then (defer_op)
    cdef public int catching         # incr._aio is in a sync step that may unwind for async
                                     # work (_Suspend); outside one, that is an IncrError
    cdef int keep_failed             # async operations in progress: `failed` lasts across their
                                     # restarts (else a failed async run would run again)
    cdef int gathering               # incr.gather calls in progress: what they demand may be
                                     # shipped to an executor even inside a running cell
    cdef dict gathered               # instance -> {dependency: (gather, thunk)}: what its last
                                     # run read inside incr.gather, by thunk; None until a gather
                                     # runs inside a cell (_core_schedule.pxi, "a demand's run-ahead")
    cdef dict ahead_blocked          # a demand's run-ahead: reader -> [gather, thunks whose
                                     # reads wait], cleared between rounds
    cdef int demand_ahead            # 1: a top-level demand may open a run-ahead; 2: it did
    # counters for stats()
    cdef long long n_recomputed, n_reused, n_cutoff, n_computed, n_failed


cdef class _Await:
    # what an async cell's call returns in async code (and cell.aget): awaiting it demands n
    # (_core_async.pxi)
    cdef Runtime rt
    cdef Instance n
    cdef tuple parent                # the stack of the computation that called it (empty: top
                                     # level)
    cdef object inner                # incr._aio._ademand's coroutine once it has to wait
    cdef int state                   # 0 not awaited yet, 1 awaiting, 2 done


cdef class BodyTask:
    # asyncio.current_task() in every step of an async body's run (_core_async.pxi)
    cdef object loop                 # the loop it runs on
    cdef object coro                 # the body's coroutine
    cdef object task                 # the asyncio task that goes on with the body once bound;
                                     # _DONE: it finished in its first step; None: neither yet
    cdef list kept                   # before that, if asked: [cancel requests, last message,
                                     # [(done callback, context)]]
    cdef public object ctx           # the body's contextvars.Context (a copy of its first
                                     # step's caller's): the task that goes on with it runs in it
    cdef object __weakref__
    cdef list keep(self)


cdef class _StepTasks:
    # the task factory of incr's own loop on a thread (_core_async.pxi)
    cdef object frames               # the stack of the first step running in sync code on
                                     # this thread now (its tasks compute for it), or None


cdef enum:   # what one step of a store lookup did (_core_store.pxi)
    DONE = 0
    PUSHED = 1
    NOMATCH = 2


# ---- The algorithms: module-level functions taking the runtime, one file per step ----------
# (_core.pyx includes the files; Runtime's Python-visible methods delegate to them. Per-edge
# helpers are `cdef inline` in their file and not declared here: record_read, record_into,
# other_busy (demand), new_frame, frames_push, frames_pop, list_pop_keep, _list_empty
# (execute), _needs_work
# (verify), _same_value (backdate).)

# _core_demand.pxi -- a demand, top-level or nested: the hit path, the cold path, the pass
# bracket (enter/leave), the instance table
cdef Instance lookup(Runtime rt, Cell c, dict table, tuple bound, bint create)
cdef dict table_for(Runtime rt, Cell cell)
cdef object demand(Runtime rt, Instance n)          # the hit path
cdef object demand_cold(Runtime rt, Instance n)     # the cold path
cdef object demand_for_effect(Runtime rt, Instance n)  # a read by a running @incr.effect
cdef object settle(Runtime rt, Instance n, object body)
cdef bint absorb_reject(Runtime rt, BaseException e) except -1
cdef void check_usable(Runtime rt) except *
cdef bint elsewhere(Runtime rt, Node n)
cdef void enter(Runtime rt) except *
cdef void leave(Runtime rt)
cdef void debug_check(Runtime rt)            # the debug build (INCR_DEBUG): invariants, or abort
cdef void apply_pending(Runtime rt)
cdef long long quiet_enter(Runtime rt)
cdef void owe(Runtime rt, list todo)

# _core_verify.pxi -- bring one instance up to date on an explicit stack (Salsa's
# maybe_changed_after)
cdef object ensure(Runtime rt, Instance n)
cdef int attempt(Runtime rt, Instance m, list stack) except -1
cdef bint run_in_stack(Runtime rt, Instance m, bint bottom) except -1

# _core_execute.pxi -- run an instance's function and record what it read
cdef Frame run_begin(Runtime rt, Instance n)
cdef Frame frame_take(Runtime rt, Instance n)        # a pooled frame for a sync run
cdef void frame_give(Runtime rt, Frame f) noexcept          # back to the pool, if nothing holds it
cdef bint run(Runtime rt, Instance n) except -1
cdef bint run_end(Runtime rt, Instance n, Frame f, bint had, object value) except -1
cdef void fail(Runtime rt, Instance n, list reads, bint had, BaseException e, str where) except *
cdef void rewire(Runtime rt, Instance n, tuple old, list new)
cdef void raise_ts(Runtime rt, Instance n)

# _core_async.pxi -- an async instance's first step, and the awaitable of a demand from async
# code (what has to wait goes on in incr._aio)
cdef bint run_async(Runtime rt, Instance n) except -1
cdef void run_finish(Runtime rt, Instance n, Frame f, bint had, object value,
                     long long start) except *     # an async run is recorded
cdef void run_failed(Runtime rt, Instance n, Frame f, bint had, int invalid,
                     BaseException e) except *
cdef object _own_loop_now(object aio)      # this thread's own loop (incr._aio._own_loop)
cdef _Await new_await(Runtime rt, Instance n, tuple parent)
cdef int _await_send(PyObject *o, PyObject *arg, PyObject **result) except -1   # its am_send

# _core_backdate.pxi -- the cutoff decision: is a recomputed value the old one?
cdef bint backdate(Instance n, object value) except -1
cdef bint same_value(object old, object new)   # _same_value, for incr._collections

# _core_propagate.pxi -- an input changes: dirty marking (push), batches, withdrawal
cdef void dirty_from(Runtime rt, Node n)
cdef void set_input(Runtime rt, Input inp, object value) except *
cdef bint deferring(Runtime rt)     # another thread's pass is running: a change is deferred
cdef bint defer_op(Runtime rt, object op) except -1   # queue op() as the next revision?
cdef object own_copy(object value)   # an input's (own copy,) of a mutable value, or None
cdef void apply_set(Runtime rt, Input inp, object value) except *
cdef void set_input_owned(Runtime rt, Input inp, object value, object shadow) except *
cdef void invalidate(Runtime rt, Instance n) except *

# _core_stabilize.pxi -- one stabilization: observed instances in timestamp order, then callbacks
cdef object stabilize_pass(Runtime rt)
cdef Stabilization _report(list log, long long reused, double seconds, long long revision)  # (_core_nodes.pxi)

# _core_schedule.pxi -- running ahead: work a pass sets aside and runs concurrently
cdef void ahead_start(Runtime rt) except *
cdef bint ahead_open(Runtime rt) except -1
cdef void ahead_round(Runtime rt, int rounds) except *
cdef void ahead_wanted(Runtime rt) except *   # what stopped calls running ahead, first
cdef void ahead_close(Runtime rt)
cdef object ahead_detach(Runtime rt, int rounds)   # inside a running loop: the round's claims
cdef int ahead_ship(Runtime rt, Instance m, list stack) except -1   # an executor
cdef list stack_cycle(Runtime rt, Instance n)   # the CycleError's labels: a read of n on the stack
cdef object lend_pass(Runtime rt, list todo)       # a pass lends its ready observed instances
cdef object lend_open(Runtime rt, list jobs, bint thunks)
cdef void lend_close(Runtime rt, object lending) except *
cdef bint lend_take(Runtime rt, Instance m) except -1   # attempt(): a worker's run of m
cdef object demand_ahead(Runtime rt, Instance n)        # settle(): a top-level demand's rounds
cdef int ahead_scan(Runtime rt, Instance m, Node d) except -1   # ensure(): a demand's reader
cdef bint ahead_wait(Runtime rt, Instance m, Node d) except -1  # waits: scan on?
cdef bint ahead_trigger(Runtime rt, Instance m, Node d) except -1
cdef void gather_tag(Runtime rt, object frame, Py_ssize_t k0, object tag) except *

# _core_store.pxi -- adopt a stored trace instead of running; record a run for the store
cdef int probe_step(Runtime rt, Instance m, list stack) except -1
cdef int no_match(Runtime rt, Persist p)               # a lookup ends without a match
cdef object index_node(Runtime rt, bytes key)          # an index node's value, or None
cdef tuple _pass_iops(object store)                    # the pass's index cursor methods
cdef Record index_entry(Runtime rt, bytes ikey, bytes key)   # a sound entry's Record, or None
cdef object index_choose(Runtime rt, bytes ikey, bytes v)    # where an index node leads
cdef void adopt(Runtime rt, Instance m, Record rec, list resolved) except *
cdef Node resolve(Runtime rt, Record rec, Py_ssize_t i)
cdef Node resolve_cell(Runtime rt, str name, bytes data, Py_ssize_t args_at)
cdef Persist persist_of(Runtime rt, Instance n)
cdef object _cell_ident(Cell c)                        # keys.cell_identity, cached if exact
cdef Persist persist_with(Runtime rt, Instance n, str ident, bytes args)
cdef object value_hash(Runtime rt, Node n)
cdef bytes _encode_value(object value)                 # keys.encode_value, common kinds fast
cdef void record(Runtime rt, Instance n) except *
cdef list _stored_refs(Runtime rt, object nodes)       # a record's dependencies, or None
cdef list refs(Runtime rt, object nodes, list stored=*)
cdef void flush(Runtime rt, bint quiet) except *
cdef bint _group_defer(object s) except -1             # commit_due's common "group" case

# _core_explain.pxi -- explain(), stats(), and _check() (the invariants above, I1-I7)
cdef object check(Runtime rt)
