# Propagate: an input changes (push). set_input checks who may change the trace now;
# apply_set ticks the clock, moves the revision (once per batch) and marks every transitive
# dependent not yet dirty as dirty (dirty_from, an explicit list: O(newly dirty)); invalidate
# withdraws an instance's value (a NACK) the same way.
#
# Invariants kept:
#   - I1: dirtiness is pushed to every dependent, transitively, and stops at instances
#     already dirty (their dependents are dirty already);
#   - I5: an observed instance made dirty is queued in rt.dirty_observed;
#   - never a mix within a pass: during another thread's pass (or with frames on another
#     thread) a set is queued in rt.pending_sets and applied by leave() as the next revision;
#     a batch opened then collects its sets (rt.collecting) and queues them as one revision;
#     on the computing thread, a set inside a computation or a stabilization is a
#     ReentrancyError.


cdef void dirty_from(Runtime rt, Node n):
    # walked by index: a list used as a stack that empties and refills reallocates
    cdef Instance m
    cdef Py_ssize_t i = 0
    if n.dependents is None:
        return
    cdef list todo = list(n.dependents)
    while i < len(todo):
        m = <Instance>todo[i]
        i += 1
        if m.flags & F_DIRTY:
            continue
        m.flags |= F_DIRTY
        if m.observed_by is not None:
            rt.dirty_observed.append(m)
        if m.dependents is not None:
            todo.extend(m.dependents)


cdef bint deferring(Runtime rt):
    # another thread's pass works on the current revision: a change now forms the next one;
    # or this thread's rt.batch() collects (opened during another thread's pass)
    if rt.collecting is not None and PyThread_get_thread_ident() in rt.collecting:
        return True
    return other_busy(rt) or (rt.frames and PyThread_get_thread_ident() != rt.owner
                              and rt.busy_depth)


cdef inline list collected(Runtime rt):
    # the sets this thread's collecting batch holds, or None (not collecting)
    if rt.collecting is None:
        return None
    st = rt.collecting.get(PyThread_get_thread_ident())
    return None if st is None else <list>(<list>st)[0]


cdef bint defer_op(Runtime rt, object op) except -1:
    # For a change of several inputs at once (an input map's set / delete / update): when
    # another thread's pass is running, op() is queued and called when that pass ends (in
    # order with other threads' sets: the next revision), and True is returned; otherwise
    # False (the caller makes the change now). Nothing between the test and the queueing
    # calls out.
    check_usable(rt)
    cdef list items
    if deferring(rt):
        items = collected(rt)
        (rt.pending_sets if items is None else items).append((None, op))
        return True
    return False


cdef void set_input(Runtime rt, Input inp, object value) except *:
    check_usable(rt)
    cdef list items
    if deferring(rt):
        # another thread's pass works on the current revision: this change forms the
        # next one, applied when that pass ends (never a mix of old and new in it); in a
        # collecting batch, part of the batch's revision
        items = collected(rt)
        (rt.pending_sets if items is None else items).append((inp, value))
        return
    if rt.frames:
        raise ReentrancyError(rt._reentrancy(f"set input {inp.name!r}"))
    if rt.stabilizing:
        raise ReentrancyError(rt._reentrancy(f"set input {inp.name!r}"))
    cur = get_value(_active)
    if cur is not None and cur is not rt and (<Runtime>cur).frames:
        raise ReentrancyError((<Runtime>cur)._reentrancy(f"set input {inp.name!r}"))
    apply_set(rt, inp, value)


from incr.keys import _registry as _keys_registry
cdef dict _type_registry = _keys_registry   # (register_type fills it in place; a C reference)


cdef object own_copy(object value):
    # An input keeps (its own copy,) of a mutable value (keys.own_args, the copy a cell keeps
    # of its arguments) and compares the next set with it: mutating the object given, or the
    # one get() returned, then setting it again is a change. None for a value with nothing
    # mutable (no copy, compared with the value itself), or one that cannot be copied.
    cdef type t = type(value)
    if t is not list and t is not dict and t is not tuple and t not in _type_registry:
        return None                 # (nothing else is copied: own_args would keep it as is)
    try:
        return _keys.own_args((value,))
    except Exception:
        return None


cdef void apply_set(Runtime rt, Input inp, object value) except *:
    cdef type t
    if _same_value(inp.value if inp.shadow is None else (<tuple>inp.shadow)[0], value):
        return
    t = type(value)
    if t is int or t is float or t is str or t is bool:   # (the common values: no call)
        inp.shadow = None
    else:
        inp.shadow = own_copy(value)
    inp.value = value
    inp.vhash = None
    rt.clock += 1
    if rt.batch_depth == 0:
        rt.revision += 1
    elif not rt.batch_bumped:
        rt.revision += 1
        rt.batch_bumped = True
    inp.changed_at = rt.clock
    inp.changed_rev = rt.revision
    dirty_from(rt, inp)


cdef void invalidate(Runtime rt, Instance n) except *:
    rt.clock += 1
    if rt.batch_depth == 0:
        rt.revision += 1
    elif not rt.batch_bumped:
        rt.revision += 1
        rt.batch_bumped = True
    if n.flags & F_HAS_VALUE:
        n.flags |= F_INVALID
        n.why = n                     # explain: withdrawn by evidence
        if not (n.flags & F_DIRTY):
            n.flags |= F_DIRTY
            if n.observed_by is not None:
                rt.dirty_observed.append(n)
    dirty_from(rt, n)
