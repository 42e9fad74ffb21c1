# Async cells, the compiled half (incr._aio holds the rest: the loop, the tasks, the restart
# points): an async instance's first step, and the awaitable that calling an async cell
# returns in async code. Both are the common case of a change propagated through async cells
# whose inputs are ready -- the body finishes in its first step and every `await other(...)`
# finds `other` up to date -- and take it with no Python frame of incr's, no StopIteration and
# no demand coroutine. Whatever has to wait goes on in incr._aio, from where it stopped:
#
#   - run_async (run(), _core_execute.pxi): create the body's coroutine, send it None. It
#     returned: the run is recorded as a sync run is (run_finish). It raised: recorded as a
#     failed run (run_failed). It yielded (it waits for something): incr._aio.went_on takes
#     the coroutine where it is. A sync step inside it unwound for async work (_Suspend): in
#     async code the unwinding goes on to the nearest restart point; in sync code
#     incr._aio.redo does the work on this thread's loop and runs the body again.
#   - _Await (what `other(...)` returns in an async cell's body, and `cell.aget(...)`):
#     awaited in the step that made it (the usual case), it demands the instance on the
#     running stack and returns its value through the am_send slot (no exception). If that
#     demand unwinds for async work, or it is awaited elsewhere (another task, top level), it
#     delegates to incr._aio._ademand, the path that waits.
#   - BodyTask (asyncio.current_task() in every step of a body, the first included: the body
#     runs as one task) and the swaps that make it current: task_swap, _body_step (a later
#     step, for incr._aio._Stepper). Compiled, so that no Ctrl-C lands between a swap and its
#     restore (one that did left the body's task current, and the loop refused every task
#     after it: a hang).
#
# Invariants kept: those of run (_core_execute.pxi): a run unwound or cancelled records
# nothing; I6: n's frame is on the caller's stack only during the first step; the running
# loop, the loop's current task and the task-frames contextvar are as before once a step is
# over, whatever it raised; a BodyTask anyone else holds (a reference, a weak reference) is
# never handed to another body.

cdef extern from "Python.h":
    int PyIter_Send(object iter, object arg, PyObject **presult) except -1
    ctypedef struct PyAsyncMethods:
        void *am_send
    ctypedef struct _PyTypeObject_async "PyTypeObject":
        PyAsyncMethods *tp_as_async

from cpython.contextvars cimport PyContextVar_Set, PyContextVar_Reset
from asyncio import _set_running_loop, Task as _Task

cdef extern from "Python.h":
    object PyContext_CopyCurrent()
    int PyContext_Enter(object ctx) except -1
    int PyContext_Exit(object ctx) except -1

cdef extern from "Python.h":
    ctypedef struct PyThreadState:
        pass
    PyThreadState *PyThreadState_Get()
    unsigned long long PyThreadState_GetID(PyThreadState *t)

# incr's own loop of the thread that last took a first step in sync code, and that loop's
# task factory. A thread state's id is never reused (asyncio caches its running loop the
# same way), so a match is this thread's loop; a closed one is replaced (incr._aio._own_loop)
cdef unsigned long long _own_tsid = 0
cdef object _own = None
cdef _StepTasks _own_tasks = None


@cython.final
cdef class _StepTasks:
    """The task factory of incr's own loop on a thread: a task created while a first step
    runs in sync code (``frames`` set) computes for that step's run, as if the step had set
    the task-frames contextvar (the tasks it spawns record their reads into its frame)."""

    def __call__(self, loop, coro, **kw):
        if self.frames is not None and kw.get("context") is None:
            ctx = contextvars.copy_context()
            ctx.run(_task_frames.set, self.frames)
            kw["context"] = ctx
        return _Task(coro, loop=loop, **kw)


cdef object _own_loop_now(object aio):
    # this thread's own loop (incr._aio._own_loop), its task factory a _StepTasks
    global _own_tsid, _own, _own_tasks
    cdef unsigned long long tsid = PyThreadState_GetID(PyThreadState_Get())
    if tsid == _own_tsid and not _own._closed:
        return _own
    own = aio._own_loop()
    tasks = own._task_factory
    if tasks is None:
        tasks = _StepTasks.__new__(_StepTasks)
        own.set_task_factory(tasks)
    _own_tsid = 0
    _own = own
    _own_tasks = tasks if type(tasks) is _StepTasks else None
    _own_tsid = tsid
    return own


cdef object _cur_tasks = None     # asyncio's loop -> current task (3.10, 3.11)
cdef object _swap_task = None     # asyncio.tasks._swap_current_task (3.12+)
cdef bint _tasks_known = False


cdef object task_swap(object loop, object task):
    # make ``task`` the current task of ``loop`` (None: none); return the one it replaces.
    # C only, with no Python line in it: a Ctrl-C is taken only where Python code runs, so it
    # never lands between a swap and what depends on it (the restore in a finally). One left
    # current by an interrupt would make the loop refuse every task it steps after it
    # ("Cannot enter into task ... while another task ... is being executed"): a hang.
    global _cur_tasks, _swap_task, _tasks_known
    if not _tasks_known:
        import asyncio.tasks as _t
        _swap_task = getattr(_t, "_swap_current_task", None)
        _cur_tasks = _t._current_tasks if _swap_task is None else None
        _tasks_known = True
    if _swap_task is not None:
        return _swap_task(loop, task)
    cdef dict cur = <dict>_cur_tasks
    prev = cur.get(loop)
    if task is not None:
        cur[loop] = task
    elif prev is not None:
        del cur[loop]
    return prev


def _task_swap(loop, task):
    """Make ``task`` the current task of ``loop`` (None: none); return the one it replaces.
    For incr._aio (drive: a loop whose run ended has no current task)."""
    return task_swap(loop, task)


cdef object _DONE = object()    # BodyTask.task of a body that finished in its first step
cdef BodyTask _spare_body = None   # one a first step used that nobody else saw (refs,
                                   # weakrefs): the next first step takes it (no allocation)

cdef extern from *:
    """
    static int incr_has_weakrefs(PyObject *o) {
        Py_ssize_t off = Py_TYPE(o)->tp_weaklistoffset;
        return off > 0 && *(PyObject **)((char *)o + off) != NULL;
    }
    """
    bint incr_has_weakrefs(object o)
    Py_ssize_t incr_refcnt "Py_REFCNT"(object o)


@cython.final
cdef class BodyTask:
    """asyncio.current_task() in every step of an async body's run (incr._aio): until the body
    has a real task (it finished in its first step, or has not been taken by one yet) it keeps
    its own cancellation requests and done callbacks; then it hands them to that task and
    forwards everything to it (cancel, cancelling, uncancel, done, ... and anyio's
    _fut_waiter). Compiled: one is made for every async run (run_async), and binding it to
    its task (_bind) is one step no Ctrl-C splits."""

    def __init__(self, loop, coro):
        self.loop = loop
        self.coro = coro

    def _bind(self, task):
        """``task`` goes on with the body."""
        self.task = task
        kept, self.kept = self.kept, None
        if kept is not None:
            for _ in range(<int>kept[0]):
                task.cancel(kept[1])
            for cb, ctx in kept[2]:
                task.add_done_callback(lambda _t, cb=cb: cb(self), context=ctx)

    def _finished(self):
        """The body finished in its first step (no task went on with it)."""
        self.task = _DONE
        kept, self.kept = self.kept, None
        if kept is not None:
            for cb, ctx in kept[2]:
                self.loop.call_soon(cb, self, context=ctx)

    cdef list keep(self):
        if self.kept is None:
            self.kept = [0, None, []]
        return self.kept

    def cancel(self, msg=None):
        t = self.task
        if t is None:
            kept = self.keep()
            kept[0] += 1
            kept[1] = msg
            return True
        return False if t is _DONE else t.cancel(msg)

    def cancelling(self):
        t = self.task
        if t is None or t is _DONE:
            return self.kept[0] if self.kept is not None else 0
        return t.cancelling()

    def uncancel(self):
        t = self.task
        if t is None or t is _DONE:
            kept = self.kept
            if kept is None or not kept[0]:
                return 0
            kept[0] -= 1
            return kept[0]
        return t.uncancel()

    def done(self):
        t = self.task
        return t is _DONE or (t is not None and t.done())

    def cancelled(self):
        t = self.task
        return t is not None and t is not _DONE and t.cancelled()

    def add_done_callback(self, cb, *, context=None):
        t = self.task
        if t is None:
            self.keep()[2].append((cb, context))
        elif t is _DONE:
            self.loop.call_soon(cb, self, context=context)
        else:
            t.add_done_callback(lambda _t: cb(self), context=context)

    def remove_done_callback(self, cb):
        return 0          # (the callbacks were wrapped: a removal is not supported)

    def get_loop(self):
        return self.loop

    def get_coro(self):
        return self.coro

    def get_name(self):
        return getattr(self.coro, "__qualname__", "incr async body")

    @property
    def _fut_waiter(self):
        t = self.task
        return None if t is None or t is _DONE else t._fut_waiter

    @property
    def _must_cancel(self):
        t = self.task
        if t is None or t is _DONE:
            return self.kept is not None and self.kept[0] > 0
        return t._must_cancel

    def __getattr__(self, name):
        t = self.task
        if t is None or t is _DONE:
            raise AttributeError(f"incr's task of an async body ({self.get_name()}) has no "
                                 f"{name!r} while it has no asyncio task")
        return getattr(t, name)

    def __repr__(self):
        return f"<incr body task {self.get_name()} of {self.task!r}>"


def _body_step(object body, object coro, object value, object exc):
    """One later step of an async body's coroutine (incr._aio._Stepper): ``coro.send(value)``,
    or ``coro.throw(exc)``, with ``body`` (the body's incr._aio.BodyTask) the current task of
    its loop for the length of the step and the stepping task current again after it,
    whatever the step raises (StopIteration: it returned). Compiled so that no Ctrl-C can land
    between the swap in and the try that swaps back (see task_swap)."""
    cdef object loop = (<BodyTask?>body).loop
    cdef object prev = task_swap(loop, body)
    try:
        if exc is None:
            return coro.send(value)
        return coro.throw(exc)
    finally:
        task_swap(loop, prev)


cdef bint run_async(Runtime rt, Instance n) except -1:
    global _spare_body
    cdef object aio = _aio_mod()
    cdef object running = _get_running_loop()
    cdef object loop = running, prev = None
    cdef BodyTask body = None
    cdef bint swapped = False
    cdef object coro, token = None, y = None, suspended = None, saved = None, ctx
    cdef _StepTasks tasks = None
    cdef PyObject *res = NULL
    cdef int sent = -1
    cdef int invalid = n.flags & F_INVALID
    cdef bint had = (n.flags & F_HAS_VALUE) != 0
    cdef long long start = rt.clock
    cdef Frame f
    cdef list frames
    if running is None:
        # Sync code: the step runs as if on this thread's own loop. Not skipped when the step
        # turns out not to wait (that is known only after it): what it may create -- a task
        # (asyncio.create_task, gather, ensure_future), a future (asyncio.sleep, wait_for, a
        # Lock or Event waiter) -- takes the running loop when it is made, and must belong to
        # the loop incr drives next (drive()), or it is bound to another loop (or refused:
        # "no running event loop") and the step that awaits it fails.
        loop = _own_loop_now(aio)
        _set_running_loop(loop)
        tasks = _own_tasks
    elif _own_tasks is not None and running is _own and _own_tasks.frames is not None:
        tasks = _own_tasks           # nested in a first step of sync code: the same loop
    f = run_begin(rt, n)
    frames = list(rt.frames)         # the caller's stack, then n's frame: n's own stack if it
    # the body's own Context from its first step on (a copy of the caller's, as
    # asyncio.create_task makes): a ContextVar it sets stays its own, never the caller's
    ctx = PyContext_CopyCurrent()
    PyContext_Enter(ctx)
    if tasks is not None:            # goes on as a task, and where the tasks it spawns in
        saved = tasks.frames         # this step record their reads: on incr's own loop the
        tasks.frames = frames        # loop's task factory gives it to them (no contextvar
    else:                            # set and reset around every step)
        token = PyContextVar_Set(_task_frames, frames)
    try:
        coro = n.cell.invoke(_keys.own_args(n.args) if n.fresh_args else n.args)
        # the body's task from this step on, never the caller's: asyncio.current_task() in
        # the body is one incr._aio.BodyTask at every step (bound to the task that goes on
        # with the body if it has to wait), so asyncio.timeout, TaskGroup and anyio's cancel
        # scopes act on the body's run alone
        body = _spare_body
        if body is None:
            body = BodyTask.__new__(BodyTask)
        else:
            _spare_body = None
        body.loop = loop
        body.coro = coro
        body.ctx = ctx
        prev = task_swap(loop, body)   # (C from here to the try's end: no Ctrl-C lands
        swapped = True                 # between the swap and the flag the finally reads)
        sent = PyIter_Send(coro, None, &res)
        y = <object>res              # (a new reference: given back below)
        Py_DECREF(y)
    except _Suspend as s:
        # a sync step inside the body (a sync cell it called, say) unwound for async work
        run_failed(rt, n, f, had, invalid, s)
        if running is not None:
            raise                    # async code: the nearest restart point does it
        suspended = s
    except BaseException as e:
        run_failed(rt, n, f, had, invalid, e)
        raise
    finally:
        if swapped:
            task_swap(loop, prev)    # the caller's task is current again
        if tasks is not None:
            tasks.frames = saved
        else:
            PyContextVar_Reset(_task_frames, token)
        PyContext_Exit(ctx)          # the caller's Context is current again
        if running is None:
            _set_running_loop(None)
    if suspended is not None:
        return aio.redo(rt, n, (<object>suspended).works)
    if sent == 0:                    # it returned y: recorded as a sync run is
        if body.kept is not None:
            body._finished()
        elif incr_refcnt(body) == 1 and not incr_has_weakrefs(body):
            body.coro = None         # (the common case: nobody saw it, nothing to hand on:
            body.loop = None         # kept for the next first step, as new)
            body.ctx = None
            _spare_body = body
        else:
            body.task = _DONE
        frames = None
        coro = None
        run_finish(rt, n, f, had, y, start)
        frame_give(rt, f)            # (back to the pool if nothing else holds it)
        return True
    try:
        return aio.went_on(rt, n, coro, y, frames, f, had, invalid, start, body)
    except BaseException:
        if rt.frames and rt.frames[len(rt.frames) - 1] is f:
            # interrupted (Ctrl-C) as went_on began, before it took the run: nobody goes on
            # with it (closed, recording nothing)
            rt.frames.pop()
            aio.abandon_step(rt, aio.Resume(n, coro, y, frames, f, had, invalid, start, body))
        raise


cdef void run_finish(Runtime rt, Instance n, Frame f, bint had, object value,
                     long long start) except *:
    # an async run of n finished (in its first step or later): recorded as a sync run is
    cdef Node d
    rt.frames.pop()
    run_end(rt, n, f, had, value)
    for d in n.deps:
        if d.changed_at > start:
            # it changed while this run was suspended (another task set it): the run may have
            # read both values, so its result is stale at once (I1, I2)
            n.flags |= F_DIRTY
            n.verified_at = start
            dirty_from(rt, n)
            if n.observed_by is not None:
                rt.dirty_observed.append(n)
            break


cdef void run_failed(Runtime rt, Instance n, Frame f, bint had, int invalid,
                     BaseException e) except *:
    rt.frames.pop()
    fail(rt, n, f.reads, had, e, "raised in cell")
    if isinstance(e, (_Suspend, _CancelledError)):
        n.flags |= invalid      # unwound: still withdrawn if it was


@cython.final
cdef class _Await:
    """Awaiting it demands an instance of a cell from async code: what calling an async cell
    returns there, and ``cell.aget(...)``. A coroutine by protocol (send, throw, close), so
    that ``asyncio.create_task`` and ``asyncio.gather`` take it."""

    def __await__(self):
        return self

    def __next__(self):
        return self.send(None)

    def send(self, value):
        # (the am_send slot is the fast way in; this is the protocol's, e.g. under a tracer)
        cdef PyObject *res = NULL
        cdef int sent = _await_send(<PyObject *>self, <PyObject *>value, &res)
        v = <object>res
        Py_DECREF(v)
        if sent == 0:
            raise StopIteration(v)
        return v

    def throw(self, typ, val=None, tb=None):
        if self.inner is not None:
            return self.inner.throw(typ, val, tb) if val is not None or tb is not None \
                else self.inner.throw(typ)
        self.state = 2             # never started: it raises where it is awaited
        if val is None:
            raise typ
        raise val

    def close(self):
        self.state = 2
        if self.inner is not None:
            inner, self.inner = self.inner, None
            inner.close()


cdef _Await new_await(Runtime rt, Instance n, tuple parent):
    cdef _Await a = _Await.__new__(_Await)
    a.rt = rt
    a.n = n
    a.parent = parent
    return a


def _awaiting(Runtime rt, Instance n, tuple parent):
    """The awaitable of instance ``n`` demanded from async code by a computation whose stack is
    ``parent`` (empty: top level). For incr._aio."""
    return new_await(rt, n, parent)


cdef int _await_send(PyObject *o, PyObject *arg, PyObject **result) except -1:
    # one step of awaiting an _Await: 0 with its value in *result, 1 with what it yields
    cdef _Await a = <_Await>o
    cdef Runtime rt
    cdef object works = None, v
    cdef int sent = -1
    if a.state == 0:
        a.state = 1
        rt = a.rt
        if a.parent and rt.frames and rt.frames[len(rt.frames) - 1] is a.parent[len(a.parent) - 1]:
            # awaited in the step that called it (the usual case): demand on the running stack
            # as it is, with no swap and no copy
            rt.catching += 1
            try:
                v = demand(rt, a.n)
            except _Suspend as s:
                works = s.works
            except BaseException:
                a.state = 2
                raise
            finally:
                rt.catching -= 1
            if works is None:
                a.state = 2
                Py_INCREF(v)
                result[0] = <PyObject *>v
                return 0
        a.inner = _aio_mod()._ademand(rt, a.n, a.parent, works)
    elif a.state == 2:
        raise RuntimeError("cannot reuse an already awaited incr demand (await the cell's "
                           "call again instead)")
    try:
        sent = PyIter_Send(a.inner, <object>arg, result)
    except BaseException:
        a.state = 2
        a.inner = None
        raise
    if sent == 0:
        a.state = 2
        a.inner = None
    return sent


cdef extern from *:
    """
    static int (*incr_await_step)(PyObject *, PyObject *, PyObject **) = NULL;
    static PySendResult incr_await_am_send(PyObject *o, PyObject *arg, PyObject **result) {
        /* PYGEN_RETURN 0, PYGEN_NEXT 1, PYGEN_ERROR -1 (an exception set) */
        int r = incr_await_step(o, arg, result);
        if (r < 0) { *result = NULL; return PYGEN_ERROR; }
        return r == 0 ? PYGEN_RETURN : PYGEN_NEXT;
    }
    """
    int (*incr_await_step)(PyObject *, PyObject *, PyObject **) except -1
    void *incr_await_am_send


cdef _enable_await_send():
    # _Await's am_send slot (what `await`, `yield from` and asyncio's tasks call first): a
    # step that returns hands its value back with no StopIteration made and caught
    global incr_await_step
    incr_await_step = _await_send
    (<_PyTypeObject_async *>_Await).tp_as_async.am_send = incr_await_am_send


_enable_await_send()
