# cython: language_level=3
"""The engine (internal): trace, revisions, change propagation. See _core.pxd for the data model.

How a change flows:

1. ``Input.set`` ticks the clock, bumps the revision (once per batch) and pushes dirtiness to
   every transitive dependent that is not dirty yet (``dirty_from``). Cost: O(newly dirty).
2. Demanding a dirty instance verifies it without recursion (``ensure``): an explicit stack walks
   its recorded dependencies in read order, brings each dirty one up to date first, and re-runs
   the instance as soon as one dependency is found changed (the rest are then re-read by the run
   itself, so a branch the new run no longer takes is never touched: Salsa's order). An instance
   whose dependencies are all unchanged is marked verified without running.
3. A run records what it reads; a recomputed value equal to the old one (per the cell's cutoff)
   keeps the old value and ``changed_at``, so nothing that read it runs (early cutoff).
4. ``stabilize`` does step 2 for every dirty observed instance, in timestamp order, then calls
   the observers' callbacks once everything is up to date (no callback sees a mix).

This file holds the imports and globals and includes the parts, one per algorithm step, each
opening with its contract and the invariants it keeps: _core_context (current, untracked,
gather), _core_nodes (Node, Input, Instance, Cell, Observer), _core_runtime (the Python
surface), then the algorithms as module-level functions taking the runtime: _core_demand,
_core_verify, _core_execute, _core_backdate, _core_propagate, _core_stabilize,
_core_schedule (run ahead), _core_store, _core_explain. The record codec is incr._codec.
"""

import contextvars
cimport cython
from libc.stdlib cimport abort
import inspect
import time
from time import monotonic as _monotonic

from cpython.contextvars cimport get_value

cdef extern from "pythread.h":
    unsigned long PyThread_get_thread_ident()

from incr.errors import (CycleError, IncrError, NotPersistableWarning, ReentrancyError, Reject,
                         _Deferred, _Suspend)
from asyncio import CancelledError as _CancelledError
from asyncio import _get_running_loop
from incr.keys import normalize_args
from incr import keys as _keys
from incr.store import DamagedRecordWarning, Store, _index_merge
import msgpack as _msgpack
import warnings as _warnings

# the record codec: a second extension module (see _codec.pxd); the per-dependency helpers
# are inline there and compile into this module
from cpython.bytes cimport PyBytes_AS_STRING
from libc.string cimport memcmp
cdef extern from "Python.h":
    object PyUnicode_DecodeUTF8(const char *s, Py_ssize_t size, const char *errors)
    object PyObject_GenericGetDict(object o, void *context)
from incr._codec cimport (Record, _u32, _blob_bytes, _blob_equals, _dep_hash_at, _rec_str,
                          _read_record, _pack_record, _index_step, _index_nodes,
                          _decode_simple, _decode_at, _add_usage_tag, _instance_key,
                          _encode_simple, _digest, _trace_bytes)
from incr._codec import NOT_SIMPLE as _NOT_SIMPLE
# re-exported: incr.store and the tests import these from here
from incr._codec import (add_usage_tag, decode_simple, index_nodes, instance_key,
                         pack_record_fields, read_record, record_checksum, utf8_valid)
cdef bytes _INDEX_ROOT = bytes(16)   # the root of every instance's index (layout: incr/store.py)

cdef object _active = contextvars.ContextVar("incr_runtime", default=None)
# the frame stack of the async run whose step is running (incr._aio sets it around each
# step), so that tasks the run spawns itself record their reads into it
cdef object _task_frames = contextvars.ContextVar("incr_task_frames", default=None)
cdef object _outer = contextvars.ContextVar("incr_outer_runtimes", default=())
import types as _types
cdef type _CoroutineType = _types.CoroutineType

# Nested runs deeper than this verify the remaining dependencies of an instance before running
# it (see ensure); shallower ones follow Salsa's order exactly.
cdef Py_ssize_t DEEP = 48
# A top-level demand or stabilization absorbs at most this many incr.Reject before giving up
# (each one regenerates the blamed node; the node's own budget bounds it much earlier).
cdef int MAX_REJECTS = 64
# True once an incr.llm node exists: passes then run generator calls ahead, concurrently
# (_core_schedule.pxi)
cdef bint _run_ahead = False
# incr._aio (imported on first use: it imports this module)
cdef object _aio = None


cdef object _aio_mod():
    global _aio
    if _aio is None:
        from incr import _aio as m
        _aio = m
    return _aio


cdef bint _async_defined = False
cdef str _SUSPEND_MSG = (
    "incr: {what} needs async work (an async cell, or an async generator or validator), and "
    "sync code running inside an event loop cannot wait for it without blocking the loop: "
    "from async code use `await cell.aget(...)`, `await async_cell(...)` or "
    "`await rt.astabilize()`")


def _note_async():
    global _async_defined
    _async_defined = True


# The debug build (INCR_DEBUG=1 pip install -e . / python setup.py build_ext --inplace): after
# every top-level operation (a demand, a stabilize, an async operation), the trace's invariants
# are checked (check(), _core_explain.pxi) and a broken one aborts the process with the list
# of what is broken -- like UVLOOP_DEBUG. The release build compiles the test away.
cdef extern from *:
    """
    #ifndef INCR_DEBUG
    #define INCR_DEBUG 0
    #endif
    """
    const bint INCR_DEBUG

DEBUG = bool(INCR_DEBUG)


cdef bint _effects_defined = False     # an @incr.effect exists: reads from one are checked


def _note_effect():
    global _effects_defined
    _effects_defined = True


cdef inline bint _loop_running():
    return _get_running_loop() is not None


def _task_frames_var():
    return _task_frames


def _active_var():
    """The context variable holding the active runtime (incr._aio sets it in its tasks)."""
    return _active


def _enable_run_ahead():
    global _run_ahead
    _run_ahead = True


# the parts, in this order (Python-level statements in them run at import, in order)
include "_core_context.pxi"
include "_core_nodes.pxi"
include "_core_runtime.pxi"

# the algorithms, one file per step (declared in _core.pxd)
include "_core_demand.pxi"
include "_core_verify.pxi"
include "_core_execute.pxi"
include "_core_async.pxi"
include "_core_backdate.pxi"
include "_core_propagate.pxi"
include "_core_stabilize.pxi"
include "_core_schedule.pxi"
include "_core_store.pxi"
include "_core_explain.pxi"



import sys as _sys
cdef str _INCR_DIR = _os.path.dirname(_os.path.abspath(__file__)) + _os.sep


def _user_level():
    # the stacklevel that names the user's line: compiled functions have no Python frame, so
    # a fixed level walks past the caller (to "sys:1"); count the innermost Python frames that
    # belong to incr itself instead
    f = _sys._getframe(0)
    level = 1
    while f is not None and f.f_code.co_filename.startswith(_INCR_DIR):
        f = f.f_back
        level += 1
    return level if f is not None else 1


def _warn(message, category):
    _warnings.warn(message, category, stacklevel=_user_level())


def _warn_once(Cell cell, str message):
    if not getattr(cell, "_incr_warned", False):
        setattr(cell, "_incr_warned", True)
        _warn(message, NotPersistableWarning)


cdef dict _stored_cells = _keys.stored_cells
cdef object _InputRef = _keys._InputRef

