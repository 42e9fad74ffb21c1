# Backdate: the early-cutoff decision (Salsa's backdate). A re-run whose new value is the old
# one per the cell's cutoff (EQUAL: _same_value; IDENTITY: `is`; NEVER; or a callable) keeps
# the old value and changed_at, so nothing that read it runs.
#
# Contract: _same_value is the one rule for Input.set, EQUAL cutoff and argument keys: same
# type and ==, all the way down (iteratively), floats bit for bit but for NaN (0.0 and -0.0
# differ, NaN equals NaN), dicts in order; it never raises (a comparison that raises means
# "changed"). A cutoff callable's exception propagates and fails the run (run_end).


cdef inline bint _same_float(double a, double b):
    if a != a:
        return b != b                   # every NaN is the same value (as in argument keys)
    return a == b and signbit(a) == signbit(b)   # 0.0 and -0.0 are two values


cdef inline bint _same_value(object old, object new):
    # The one rule for Input.set, EQUAL cutoff and argument keys: the same value is the same
    # type and ==, all the way down, with floats compared bit for bit but for NaN (0.0 and
    # -0.0 differ, NaN equals NaN) and dicts compared in order (a reordered dict iterates
    # differently, so it is a changed value). A comparison that raises means "changed".
    cdef type t
    if old is new:
        return True
    t = type(old)
    if t is not type(new):
        return False
    if t is int or t is str:
        return old == new             # (exact types: their == cannot raise or be overridden)
    if t is float:
        return _same_float(<double>old, <double>new)
    if t is list or t is tuple or t is dict:
        return _same_deep(old, new)
    if t is frozenset:
        return _same_set(old, new)
    try:
        return bool(old == new)
    except Exception:
        return False


cdef bint same_value(object old, object new):
    # _same_value for other modules (incr._collections: an input map's no-op test and a map
    # node's per-key change test are this rule, not a copy of it)
    return _same_value(old, new)


cdef bint _same_set(object a, object b):
    # frozensets have no order to pair their elements by: compare their canonical, type-tagged
    # key forms (frozenset({1}) and frozenset({1.0}) differ, as argument keys do)
    try:
        if not a == b:
            return False
        return _keys.normalize_args("", ("v",), (a,)) == _keys.normalize_args("", ("v",), (b,))
    except Exception:
        return False


cdef bint _same_deep(object old, object new):
    # _same_value for containers, walked on an explicit stack (no recursion). A pair of
    # containers met again (a value that refers to itself) is not walked twice: cyclic values
    # compare as far as they can be told apart, and the walk ends.
    cdef list stack = [old, new]
    cdef set seen = set()
    cdef object a, b, pair
    cdef type t
    cdef Py_ssize_t i, n
    while stack:
        b = stack.pop()
        a = stack.pop()
        if a is b:
            continue
        t = type(a)
        if t is not type(b):
            return False
        if t is list or t is tuple or t is dict:
            pair = (id(a), id(b))
            if pair in seen:
                continue
            seen.add(pair)
        if t is float:
            if not _same_float(<double>a, <double>b):
                return False
        elif t is frozenset:
            if not _same_set(a, b):
                return False
        elif t is list or t is tuple:
            n = len(a)
            if n != len(b):
                return False
            for i in range(n):
                stack.append(a[i])
                stack.append(b[i])
        elif t is dict:
            if len(a) != len(b):
                return False
            for ka, kb in zip(a, b):
                if not _same_value(ka, kb):
                    return False
                stack.append((<dict>a)[ka])
                stack.append((<dict>b)[kb])
        else:
            try:
                if not a == b:
                    return False
            except Exception:
                return False
    return True


cdef bint backdate(Instance n, object value) except -1:
    # The cutoff decision for a re-run of n that had a value: True when `value` is n's old
    # value per its cell's cutoff; the caller (run_end) then keeps the old value and
    # changed_at, so nothing that read n runs. Whatever the cutoff raises propagates (the run
    # then fails).
    cdef int kind = n.cell.cutoff_kind
    if kind == C_EQUAL:
        return _same_value(n.value, value)
    if kind == C_IDENTITY:
        return n.value is value
    if kind == C_CALLABLE:
        return bool(n.cell.cutoff(n.value, value))
    return False
