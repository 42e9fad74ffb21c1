# cython: language_level=3
"""Compiled part of incr.collections: FoldTree, an aggregate-maintaining treap.

Keys are kept in order (they must be mutually orderable); each node holds the aggregate of its
subtree, so the total is the root's aggregate. ``set``/``delete`` of one key touch one root path
(expected O(log n) nodes). Aggregates combine left subtree, the node, right subtree in key
order, so ``reduce(op)`` needs ``op`` associative only (not commutative).
"""

cimport cython
from cpython.object cimport PyObject_RichCompareBool, Py_LT, Py_GT
from cpython.dict cimport PyDict_GetItem, PyDict_SetItem, PyDict_DelItem, PyDict_Next
from cpython.ref cimport PyObject
from cpython.set cimport PySet_Add

cdef extern from "Python.h":
    dict _PyDict_NewPresized(Py_ssize_t minused)   # (CPython 3.10-3.13: cpython/dictobject.h)
    int PyObject_GC_IsTracked(object o)
    void PyObject_GC_UnTrack(object o)
from heapq import heapify, heappop, heappush
from types import CoroutineType
from collections.abc import Mapping, KeysView, ItemsView, ValuesView

from incr._core cimport (Cell, Runtime, Instance, Node, Input, Frame, demand, lookup,
                        table_for, quiet_enter, set_input, run, same_value, deferring,
                        defer_op, own_copy, set_input_owned)
from incr._core import EQUAL, IDENTITY, current
from incr.errors import IncrError, _Deferred

_EMPTY = object()


@cython.final
cdef class Stamp:
    """The value of an input map's anchor input: a change counter that the store cannot
    encode (so nothing that reads it is ever recorded)."""

    cdef readonly long long n

    def __init__(self, long long n):
        self.n = n

    def __eq__(self, other):
        return type(other) is Stamp and (<Stamp>other).n == self.n

    def __ne__(self, other):
        return not (type(other) is Stamp and (<Stamp>other).n == self.n)

    def __hash__(self):
        return hash(self.n)

    def __repr__(self):
        return f"<change {self.n}>"

    def __reduce__(self):
        raise TypeError("an input map's change counter is not stored or copied")


@cython.final
@cython.no_gc
cdef class TNode:
    # Not tracked by the cyclic collector: a million keys are a million nodes, and the nodes
    # form no cycles among themselves (parent pointers are borrowed, not references).
    pass


cdef inline bint _before(tuple a, tuple b) except -1:
    # top_k order: larger sort key first; equal sort keys: smaller map key first
    if PyObject_RichCompareBool(a[0], b[0], Py_GT):
        return True
    if PyObject_RichCompareBool(b[0], a[0], Py_GT):
        return False
    return PyObject_RichCompareBool(a[1], b[1], Py_LT)


cdef tuple _merge(tuple a, tuple b, Py_ssize_t k):
    cdef Py_ssize_t i = 0, j = 0, na = len(a), nb = len(b)
    cdef list out
    if nb == 0:
        return a if na <= k else a[:k]
    if na == 0:
        return b if nb <= k else b[:k]
    out = []
    while len(out) < k and (i < na or j < nb):
        if j >= nb or (i < na and not _before(<tuple>b[j], <tuple>a[i])):
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    return tuple(out)


@cython.final
cdef class FoldTree:
    """An ordered map from keys to values that keeps one aggregate of all values.

    ``FoldTree("sum")``, ``"min"``, ``"max"``, ``("reduce", op, identity)``,
    ``("top_k", k)``. ``set(key, value, sk=None)`` (``sk``: the sort key for top_k),
    ``delete(key)``, ``value`` (the aggregate; the identity / None / () when empty).
    """

    def __init__(self, kind, op=None, identity=None, Py_ssize_t k=0):
        self.root = None
        self.index = {}
        self.dirty = False
        cdef unsigned long long seed = 0x9E3779B97F4A7C15
        self.rng = seed
        self.op = op
        self.identity = identity
        self.k = k
        if kind == "sum":
            self.kind = K_SUM
            self.identity = 0 if identity is None else identity
        elif kind == "min":
            self.kind = K_MIN
        elif kind == "max":
            self.kind = K_MAX
        elif kind == "reduce":
            if not callable(op):
                raise TypeError(f"reduce needs a callable op, got {op!r}")
            self.kind = K_REDUCE
        elif kind == "top_k":
            if k < 0:
                raise ValueError(f"top_k needs k >= 0, got {k}")
            self.kind = K_TOPK
            self.identity = ()
        else:
            raise ValueError(f"unknown fold kind {kind!r}")

    cdef unsigned int next_prio(self):
        # xorshift64*: deterministic priorities (the shape depends only on the operations)
        cdef unsigned long long x = self.rng
        x ^= x >> 12
        x ^= x << 25
        x ^= x >> 27
        self.rng = x
        cdef unsigned long long m = 0x2545F4914F6CDD1D
        return <unsigned int>((x * m) >> 32)

    cdef void pull(self, TNode n) except *:
        # n.agg from its children's aggregates and its own value, in key order
        cdef object a
        cdef TNode l = n.left, r = n.right
        if self.kind == K_SUM:
            a = n.value
            if l is not None:
                a = l.agg + a
            if r is not None:
                a = a + r.agg
        elif self.kind == K_MIN:
            a = n.value
            if l is not None and PyObject_RichCompareBool(l.agg, a, Py_LT):
                a = l.agg
            if r is not None and PyObject_RichCompareBool(r.agg, a, Py_LT):
                a = r.agg
        elif self.kind == K_MAX:
            a = n.value
            if l is not None and PyObject_RichCompareBool(l.agg, a, Py_GT):
                a = l.agg
            if r is not None and PyObject_RichCompareBool(r.agg, a, Py_GT):
                a = r.agg
        elif self.kind == K_REDUCE:
            a = n.value
            if l is not None:
                a = self.op(l.agg, a)
            if r is not None:
                a = self.op(a, r.agg)
        else:
            a = (n.sk,)
            if self.k == 0:
                a = ()
            if l is not None:
                a = _merge(<tuple>l.agg, <tuple>a, self.k)
            if r is not None:
                a = _merge(<tuple>a, <tuple>r.agg, self.k)
        n.agg = a

    cdef void fix_up(self, TNode n) except *:
        # recompute aggregates from n to the root
        while n is not None:
            self.pull(n)
            if n.parent == NULL:
                break
            n = <TNode>n.parent

    cdef void rotate_up(self, TNode x) except *:
        # x takes its parent's place; the parent becomes x's child (order kept)
        cdef TNode p = <TNode>x.parent
        cdef TNode g = <TNode>p.parent if p.parent != NULL else None
        cdef TNode c
        if p.left is x:
            c = x.right
            p.left = c
            x.right = p
        else:
            c = x.left
            p.right = c
            x.left = p
        if c is not None:
            c.parent = <void *>p
        p.parent = <void *>x
        if g is None:
            x.parent = NULL
            self.root = x
        else:
            x.parent = <void *>g
            if g.left is p:
                g.left = x
            else:
                g.right = x
        self.pull(p)
        self.pull(x)

    cdef void repair(self) except *:
        # after an exception out of set / delete (the user's op, a value's comparison, a
        # Ctrl-C in either): the shape is whole -- each step relinks the nodes before it
        # calls the user -- but aggregates on the path may be stale. All recomputed, children
        # first: O(n), once per exception; `dirty` stays set if this raises too.
        cdef list stack = [], order = []
        cdef TNode n
        cdef Py_ssize_t i
        if self.root is not None:
            stack.append(self.root)
        while stack:
            n = <TNode>stack.pop()
            order.append(n)
            if n.left is not None:
                stack.append(n.left)
            if n.right is not None:
                stack.append(n.right)
        for i in range(len(order) - 1, -1, -1):
            self.pull(<TNode>order[i])
        self.dirty = False

    cpdef set(self, object key, object value, object sk=None):
        """Give ``key`` the value ``value`` (adding the key if new). O(log n) expected."""
        cdef TNode n = self.index.get(key)
        cdef TNode cur, nxt
        if self.dirty:
            self.repair()
        self.dirty = True               # until this set is done (an exception keeps it)
        if n is not None:
            n.value = value
            if self.kind == K_TOPK:
                n.sk = (value if sk is None else sk, key, value)
            # (a set whose rotations an exception cut short left n above its place)
            while n.parent != NULL and (<TNode>n.parent).prio < n.prio:
                self.rotate_up(n)
            self.fix_up(n)
            self.dirty = False
            return
        n = TNode.__new__(TNode)
        n.key = key
        n.value = value
        if self.kind == K_TOPK:
            n.sk = (value if sk is None else sk, key, value)
        n.prio = self.next_prio()
        n.parent = NULL
        if self.root is None:
            self.root = n
        else:
            cur = self.root
            while True:
                if PyObject_RichCompareBool(key, cur.key, Py_LT):
                    nxt = cur.left
                    if nxt is None:
                        cur.left = n
                        break
                else:
                    nxt = cur.right
                    if nxt is None:
                        cur.right = n
                        break
                cur = nxt
            n.parent = <void *>cur
        self.index[key] = n
        self.pull(n)
        while n.parent != NULL and (<TNode>n.parent).prio < n.prio:
            self.rotate_up(n)
        if n.parent != NULL:
            self.fix_up(<TNode>n.parent)
        self.dirty = False

    cpdef bint delete(self, object key) except -1:
        """Remove ``key``; False if it was not there. O(log n) expected."""
        cdef TNode n = self.index.get(key)
        cdef TNode c, p
        if n is None:
            return False
        if self.dirty:
            self.repair()
        self.dirty = True
        # rotated down to a leaf (each rotation may call the user: the key stays in the index
        # until the node is out, so that a delete cut short is done again, not forgotten)
        while n.left is not None or n.right is not None:
            if n.left is None:
                c = n.right
            elif n.right is None:
                c = n.left
            elif n.left.prio > n.right.prio:
                c = n.left
            else:
                c = n.right
            self.rotate_up(c)
        del self.index[key]
        if n.parent == NULL:
            self.root = None
        else:
            p = <TNode>n.parent
            if p.left is n:
                p.left = None
            else:
                p.right = None
            n.parent = NULL
            self.fix_up(p)
        self.dirty = False
        return True

    @property
    def value(self):
        """The aggregate of every value (key order), or the empty tree's value."""
        if self.root is None:
            return self.identity
        if self.dirty:
            self.repair()
        if self.kind == K_TOPK:
            return tuple([(it[1], it[2]) for it in <tuple>self.root.agg])
        return self.root.agg

    def get(self, key, default=None):
        cdef TNode n = self.index.get(key)
        return default if n is None else n.value

    def __len__(self):
        return len(self.index)

    def __contains__(self, key):
        return key in self.index

    def keys(self):
        """The keys, in key order."""
        return [k for k, _ in self.items()]

    def items(self):
        """(key, value) pairs in key order."""
        cdef list out = []
        cdef list stack = []
        cdef TNode n = self.root
        while stack or n is not None:
            while n is not None:
                stack.append(n)
                n = n.left
            n = <TNode>stack.pop()
            out.append((n.key, n.value))
            n = n.right
        return out

    def depth(self):
        """The height of the tree (for tests and benchmarks)."""
        cdef list stack = []
        cdef TNode n
        cdef int best = 0, d
        if self.root is not None:
            stack.append((self.root, 1))
        while stack:
            n, d = stack.pop()
            if d > best:
                best = d
            if n.left is not None:
                stack.append((n.left, d + 1))
            if n.right is not None:
                stack.append((n.right, d + 1))
        return best

    def _check(self):
        """Verify order, heap priorities, parent pointers and every aggregate. O(n)."""
        cdef list stack = []
        cdef TNode n
        if self.root is not None:
            if self.root.parent != NULL:
                raise AssertionError("root has a parent")
            stack.append(self.root)
        count = 0
        while stack:
            n = stack.pop()
            count += 1
            for c in (n.left, n.right):
                if c is not None:
                    if (<TNode>c).parent != <void *>n:
                        raise AssertionError("parent pointer")
                    if (<TNode>c).prio > n.prio:
                        raise AssertionError("heap order")
                    stack.append(c)
            old = n.agg
            self.pull(n)
            if not (old == n.agg):
                raise AssertionError(f"aggregate at {n.key!r}: {old!r} != {n.agg!r}")
        if count != len(self.index):
            raise AssertionError("index and tree disagree")
        ks = [k for k, _ in self.items()]
        if any(not (a < b) for a, b in zip(ks, ks[1:])):
            raise AssertionError("key order")
        return True


cdef inline bint _is_int(object v):
    # exact int or bool: integer addition is exact, associative and commutative, so a running
    # total updated by differences is the sum in any order (the tree's, the key order's)
    return type(v) is int or type(v) is bool


@cython.final
cdef class SumFold:
    """The sum of a keyed collection of values, for ``IncrMap.sum``.

    While every value is an ``int`` (or ``bool``) it keeps a dict of the values and a running
    total: one changed key is one subtraction and one addition (O(1), exact, no tree). The
    first value of another type (a float, a Decimal, a str...) moves everything into a
    ``FoldTree("sum")`` once (O(n)), which then combines in key order as before.
    ``n_delta`` / ``n_tree`` count the updates each path took (for tests).
    """

    def __init__(self, identity=0):
        self.vals = {}
        self.total = 0
        self.tree = None
        self.identity = identity
        self.n_delta = 0
        self.n_tree = 0

    @property
    def mode(self):
        """``"int"`` (running total) or ``"tree"``."""
        return "int" if self.tree is None else "tree"

    cdef void to_tree(self) except *:
        cdef FoldTree t = FoldTree("sum", identity=self.identity)
        for k, v in self.vals.items():
            t.set(k, v)
        self.tree = t
        self.vals = None
        self.total = None

    cpdef set(self, object key, object value):
        cdef PyObject *old
        if self.tree is None:
            if _is_int(value):
                old = PyDict_GetItem(self.vals, key)
                if old == NULL:
                    self.total = self.total + value
                else:
                    self.total = (self.total - <object>old) + value
                PyDict_SetItem(self.vals, key, value)
                self.n_delta += 1
                return
            self.to_tree()
        self.tree.set(key, value)
        self.n_tree += 1

    def load(self, dict data):
        """Set every (key, value) of ``data`` into an empty SumFold, in one pass."""
        if len(self) != 0:
            raise ValueError("SumFold.load needs an empty SumFold")
        cdef object total = 0
        for v in data.values():
            if not _is_int(v):
                for k, v in data.items():
                    self.set(k, v)
                return
            total = total + v
        self.vals = dict(data)
        self.total = total
        self.n_delta += len(data)

    cpdef bint delete(self, object key) except -1:
        cdef PyObject *old
        if self.tree is None:
            old = PyDict_GetItem(self.vals, key)
            if old == NULL:
                return False
            self.total = self.total - <object>old
            PyDict_DelItem(self.vals, key)
            self.n_delta += 1
            return True
        self.n_tree += 1
        return self.tree.delete(key)

    cdef object cvalue(self):
        cdef object v
        if self.tree is not None:
            v = self.tree.value
            if type(v) is bool and len(self.tree):
                # one bool left in the tree (its aggregate is the value itself): plain sum()
                # and the running total give the int, so the tree does too, whatever the history
                return 0 + v
            return v
        if not self.vals:
            return self.identity
        return self.total

    @property
    def value(self):
        """The sum of every value, or the identity when there is none."""
        return self.cvalue()

    def keys(self):
        if self.tree is not None:
            return [k for k, _ in self.tree.items()]
        return list(self.vals)

    def __len__(self):
        return len(self.vals) if self.tree is None else len(self.tree)

    def _check(self):
        if self.tree is not None:
            return self.tree._check()
        if self.total != sum(self.vals.values()):
            raise AssertionError(f"running total {self.total!r} != {sum(self.vals.values())!r}")
        return True


@cython.final
cdef class MinMaxFold:
    """The least (``"min"``) or greatest (``"max"``) value of a keyed collection, for
    ``IncrMap.min`` / ``max``.

    While every value is an ``int`` (not a bool) it keeps a dict of the values, a count of the
    keys holding each value and a binary heap of values with lazy deletion: one changed key is
    one push (O(log n) C comparisons, O(1) on average), stale heap entries are dropped when
    they reach the top, and the heap is rebuilt from the live values when it holds twice as
    many entries as there are keys (amortized O(1)). Equal ints are indistinguishable, so the
    result is the one any order gives. The first value of another type moves everything into
    a ``FoldTree`` once (O(n)). ``n_heap`` / ``n_tree`` count the updates each path took.
    """

    def __init__(self, kind, identity=None):
        if kind not in ("min", "max"):
            raise ValueError(f"MinMaxFold needs 'min' or 'max', got {kind!r}")
        self.is_max = kind == "max"
        self.vals = {}
        self.counts = {}
        self.heap = []
        self.tree = None
        self.identity = identity
        self.n_heap = 0
        self.n_tree = 0

    @property
    def mode(self):
        """``"int"`` (heap) or ``"tree"``."""
        return "int" if self.tree is None else "tree"

    cdef void to_tree(self) except *:
        cdef FoldTree t = FoldTree("max" if self.is_max else "min", identity=self.identity)
        for k, v in self.vals.items():
            t.set(k, v)
        self.tree = t
        self.vals = None
        self.counts = None
        self.heap = None

    cdef void drop_value(self, object v) except *:
        cdef Py_ssize_t c = self.counts[v] - 1
        if c:
            self.counts[v] = c
        else:
            del self.counts[v]

    cdef void maybe_rebuild(self) except *:
        if len(self.heap) > 2 * len(self.vals) + 64:
            h = [(-v if self.is_max else v) for v in self.counts]
            heapify(h)
            self.heap = h

    cpdef set(self, object key, object value):
        cdef PyObject *old
        if self.tree is None:
            if type(value) is int:
                old = PyDict_GetItem(self.vals, key)
                if old != NULL:
                    if <object>old == value:
                        return
                    self.drop_value(<object>old)
                PyDict_SetItem(self.vals, key, value)
                self.counts[value] = self.counts.get(value, 0) + 1
                heappush(self.heap, -value if self.is_max else value)
                self.n_heap += 1
                self.maybe_rebuild()
                return
            self.to_tree()
        self.tree.set(key, value)
        self.n_tree += 1

    cpdef bint delete(self, object key) except -1:
        cdef PyObject *old
        if self.tree is None:
            old = PyDict_GetItem(self.vals, key)
            if old == NULL:
                return False
            self.drop_value(<object>old)
            PyDict_DelItem(self.vals, key)
            self.n_heap += 1
            self.maybe_rebuild()
            return True
        self.n_tree += 1
        return self.tree.delete(key)

    @property
    def value(self):
        """The least / greatest value, or the identity when there is none."""
        if self.tree is not None:
            return self.tree.value
        if not self.vals:
            return self.identity
        heap = self.heap
        while True:
            top = heap[0]
            v = -top if self.is_max else top
            if v in self.counts:
                return v
            heappop(heap)

    def keys(self):
        if self.tree is not None:
            return [k for k, _ in self.tree.items()]
        return list(self.vals)

    def __len__(self):
        return len(self.vals) if self.tree is None else len(self.tree)

    def _check(self):
        if self.tree is not None:
            return self.tree._check()
        want = {}
        for v in self.vals.values():
            want[v] = want.get(v, 0) + 1
        if want != self.counts:
            raise AssertionError("value counts disagree with the values")
        live = set((-v if self.is_max else v) for v in self.counts)
        if not live <= set(self.heap):
            raise AssertionError("a live value is missing from the heap")
        if self.vals:
            got = self.value
            want_v = max(self.vals.values()) if self.is_max else min(self.vals.values())
            if got != want_v:
                raise AssertionError(f"{got!r} != {want_v!r}")
        return True


# ==== the collection nodes ==================================================================
# incr.collections' classes derive from these. Read incr/collections.py's docstring first: it
# says how a node propagates (change logs, pending keys, one instance per key). What is here is
# the per-key work of one run, compiled: pull the upstream's changed keys, call the function,
# put the result, log the change, update the fold.

_ABSENT = object()          # "no entry" (a value of None is an entry)
cdef object ABSENT = _ABSENT
cdef Py_ssize_t LOG_MIN = 4096   # a change log is trimmed past this length and the map's size
cdef dict NOKW = {}

cdef enum:
    M_OTHER = 0      # a node whose _drive is Python (join)
    M_INPUT = 1      # an input map
    M_MAP = 2        # map(fn)
    M_FILTER = 3     # filter(pred)
    M_HOOKS = 4      # one upstream, Python _compute / _apply (map_keys, group_by)

MODE_OTHER, MODE_INPUT, MODE_MAP, MODE_FILTER, MODE_HOOKS = M_OTHER, M_INPUT, M_MAP, M_FILTER, M_HOOKS

_KINDS = {bool: "number", int: "number", float: "number", str: "str", bytes: "bytes",
          type(None): "none", tuple: "tuple"}


def _key_kind(key, where, whole=_EMPTY):
    kind = _KINDS.get(type(key))
    if kind is None:
        raise TypeError(f"{where}: a key must be None, bool, int, float, str, bytes or a tuple "
                        f"of them, got {type(key).__name__} {key!r}")
    if type(key) is float and key != key:
        raise ValueError(f"{where}: key {(key if whole is _EMPTY else whole)!r}: NaN cannot "
                         f"be a key (it is not equal to itself and has no place in key order); "
                         f"use None or another value")
    if kind == "tuple":
        for k in key:
            _key_kind(k, where, key if whole is _EMPTY else whole)
    return kind


def same(a, b):
    """The core's "same value" test (Input.set's): input maps' no-op test."""
    return same_value(a, b)


cdef object _shape_merge(object shape, tuple key, str where, object whole):
    # Tuple keys are ordered position by position: each position must hold one kind across a
    # map's keys (numbers, str, bytes, None, or tuples of the same shape), else two keys cannot
    # be compared. `shape` is the list of position kinds seen (None: none yet); returns the
    # shape with `key` added (a new list when it grows: `shape` itself is not changed), or
    # raises TypeError naming the map and the key.
    cdef list out = shape if shape is not None else []
    cdef bint copied = shape is None
    cdef Py_ssize_t i
    for i in range(len(key)):
        part = key[i]
        kind = _KINDS.get(type(part))
        if i >= len(out):
            if not copied:
                out = list(out)
                copied = True
            out.append(_shape_merge(None, <tuple>part, where, whole) if kind == "tuple" else kind)
            continue
        have = out[i]
        if kind == "tuple" and type(have) is list:
            sub = _shape_merge(have, <tuple>part, where, whole)
            if sub is not have:
                if not copied:
                    out = list(out)
                    copied = True
                out[i] = sub
        elif kind != have:
            raise TypeError(f"{where}: key {whole!r} cannot be ordered with the map's other keys: "
                            f"a part of it is {'a tuple' if kind == 'tuple' else kind} where "
                            f"theirs is {'a tuple' if type(have) is list else have} (tuple keys "
                            f"are compared position by position: each position holds one kind)")
    return out


def _check_shapes(keys, where):
    """Raise TypeError naming ``where`` and the key if tuple keys cannot all be ordered."""
    shape = None
    for k in keys:
        if type(k) is tuple:
            shape = _shape_merge(shape, k, where, k)
    return shape


@cython.final
cdef class MapView:
    """The value of a map cell: a read-only mapping of the map's entries, in key order.

    Two views are equal when they are of the same map at the same change, so a map cell whose
    run changed no key is cut off. A view reads the map as it is now (as of its last
    stabilization or demand), not a copy taken when the view was made.
    """

    def __init__(self, MapBase node, long long version):
        self._node = node
        self._version = version

    def __eq__(self, other):
        return (type(other) is MapView and (<MapView>other)._node is self._node
                and (<MapView>other)._version == self._version)

    def __ne__(self, other):
        return not self.__eq__(other)

    def __hash__(self):
        return hash((id(self._node), self._version))

    def __getitem__(self, key):
        return self._node._data[key]

    def get(self, key, default=None):
        return self._node._data.get(key, default)

    def __iter__(self):
        return iter(self._node._sorted_keys())

    def __len__(self):
        return len(self._node._data)

    def __contains__(self, key):
        return key in self._node._data

    def keys(self):
        return KeysView(self)

    def items(self):
        return ItemsView(self)

    def values(self):
        return ValuesView(self)

    def __repr__(self):
        return f"<incr map {self._node.label}: {len(self._node._data)} keys>"


Mapping.register(MapView)


@cython.final
cdef class PerKeyFn:
    """Calls a per-key function: a cell (one instance per key, demanded untracked, with what
    the instance read besides its arguments tracked by the node) or a plain function (called
    directly, its reads recorded on the node as a whole)."""

    def __init__(self, node, fn):
        if not callable(fn):
            raise TypeError(f"{node.label}: expected a function or an incr cell, got {fn!r}")
        self.node = node
        self.fn = fn
        self.is_cell = isinstance(fn, Cell)   # (an async function: refused by the operator)
        self.key_ext = {}
        self.ext_keys = {}
        self.ext_seen = {}
        self.glob = {}
        self.key_inst = {}
        self.n_dropped = 0

    def check(self, rt, all_keys):
        """Read (tracked) every outside dependency; the keys to run again because one moved."""
        # Reading a dependency may run cells (the user's code: it may raise, or a Ctrl-C may
        # land there). The marks move only once every one was read, in one step with no call
        # out, and the keys they give go to the node's _pending before any is run: a run cut
        # short anywhere keeps the marks, and the next run finds the same changes.
        cdef list ext_moved = [], glob_moved = []
        out = set()
        for dep, seen in list(self.ext_seen.items()):
            rt._read(dep)
            ca = dep._changed_at
            if ca != seen:
                ext_moved.append((dep, ca))
        for dep, seen in list(self.glob.items()):
            rt._read(dep)
            ca = dep._changed_at
            if ca != seen:
                glob_moved.append((dep, ca))
        for dep, ca in ext_moved:
            self.ext_seen[dep] = ca
            out.update(self.ext_keys.get(dep, ()))
        for dep, ca in glob_moved:
            self.glob[dep] = ca
        if glob_moved:
            out.update(all_keys)
        return out

    def __call__(self, rt, key, tuple args):
        return self.call(<Runtime?>rt, key, args)

    cdef object call(self, Runtime rt, object key, tuple args):
        cdef Cell c
        cdef Instance inst
        cdef list reads
        cdef Py_ssize_t n0
        cdef long long q
        cdef tuple deps
        if self.is_cell:
            c = <Cell>self.fn
            inst = lookup(rt, c, table_for(rt, c), c.bound(args, NOKW), True)
            q = quiet_enter(rt)          # untracked: the node does not depend on each instance
            try:
                v = demand(rt, inst)
            finally:
                rt.quiet = q
            deps = inst.deps
            if deps or key in self.key_ext:
                self.set_ext(key, deps if deps is not None else ())
            prev = self.key_inst.get(key)
            if prev is not inst:
                self.key_inst[key] = inst
                _use(rt, inst, 1)
                if prev is not None:
                    _use(rt, <Instance>prev, -1)   # the key's instance for its old value
            return v
        reads = (<Frame>rt.frames[len(rt.frames) - 1]).reads   # rt._reads(): the running node's
        n0 = len(reads)
        v = self.fn(*args)
        if len(reads) > n0:
            self.note(reads, n0)
        if type(v) is CoroutineType:
            v.close()
            raise TypeError(f"{self.node.label}: the function returned a coroutine for key "
                            f"{key!r}; a map's values are never coroutines: make it an "
                            f"@incr.cell (an async cell) or return the value")
        return v

    cdef void note(self, list reads, Py_ssize_t n0) except *:
        # a plain function read reads[n0:]: a change there runs it again for every key
        for dep in reads[n0:]:
            if dep not in self.glob:
                self.glob[dep] = dep._changed_at

    cdef void set_ext(self, object key, tuple deps) except *:
        old = self.key_ext.pop(key, ())
        for d in old:
            ks = self.ext_keys.get(d)
            if ks is not None:
                ks.discard(key)
                if not ks:
                    del self.ext_keys[d]
                    self.ext_seen.pop(d, None)
        if deps:
            self.key_ext[key] = deps
            for d in deps:
                if d not in self.ext_keys:
                    self.ext_keys[d] = set()
                    self.ext_seen[d] = d._changed_at
                self.ext_keys[d].add(key)

    cpdef drop(self, object key):
        """``key`` left the map: forget what its instance read, and withdraw the instance."""
        if key in self.key_ext:
            self.set_ext(key, ())
        inst = self.key_inst.pop(key, None)
        if inst is not None:
            _use(self.node._rt, <Instance>inst, -1)
            self.n_dropped += 1


cdef void _use(object rt, Instance inst, int delta) except *:
    # how many map nodes hold `inst` as the instance of one of their keys (two maps of one cell
    # share instances); at zero it is withdrawn from the runtime (rt._drop: kept if anything
    # else reads or observes it), so a deleted or changed key's instance can be freed
    cdef dict uses = rt.extensions.get("incr.collections")
    if uses is None:
        uses = rt.extensions["incr.collections"] = {}
    cdef object c = uses.get(inst)
    cdef Py_ssize_t n = (0 if c is None else <Py_ssize_t>c) + delta
    if n > 0:
        uses[inst] = n
        return
    uses.pop(inst, None)
    if rt._drop(inst):
        llm = rt.llm
        if llm is not None:     # an incr.llm node: its bookkeeping goes with it
            llm.nodes.pop(inst, None)
            llm.spot.pop(inst, None)


cdef void _no_coroutines(MapBase node, dict data) except *:
    # a bulk build's values: a coroutine is never a value (each one is closed, none kept)
    cdef object bad = ABSENT
    cdef PyObject *key
    cdef PyObject *val
    cdef Py_ssize_t pos = 0
    cdef bint any_bad = False
    while PyDict_Next(data, &pos, &key, &val):     # (no tuple per entry: a bulk build's cost)
        if type(<object>val) is CoroutineType:
            any_bad = True
            break
    if not any_bad:
        return
    for k, v in data.items():
        if type(v) is CoroutineType:
            v.close()
            if bad is ABSENT:
                bad = k
    if bad is not ABSENT:
        raise TypeError(f"{node.label}: the function returned a coroutine for key {bad!r}; a "
                        f"map's values are never coroutines: make it an @incr.cell (an async "
                        f"cell) or return the value")


def _refuse_foreign(node, cur):
    # a collection read inside a running cell of another runtime: that cell would not depend on
    # it (a silent stale value later), so it is refused, as an Input of another runtime is
    if cur is not None and cur is not node._rt:
        running = cur._running()
        if running is not None:
            raise IncrError(f"{node.label} belongs to another runtime than the one running "
                            f"{running.label_text}; declare it on that runtime")


cdef class NodeBase(Cell):
    """A collection node: a cell with no arguments whose run updates the node (_drive)."""

    def __init__(self, rt, str label, cutoff=EQUAL):
        node = self

        def drive():
            return node._drive()

        drive.__qualname__ = drive.__name__ = label
        drive.__module__ = "incr.collections"
        Cell.__init__(self, drive, cutoff=cutoff)
        # never stored (its state is in this process), and no NotPersistableWarning for it
        self._incr_warned = True
        self._rt = rt
        self.label = label
        self._pending = set()

    cdef object invoke(self, tuple args):
        # the engine runs the node: its compiled run, no Python frame in between
        return self.drive()

    cdef object drive(self):
        return self._drive()

    cdef Instance own(self):
        if self.inst is None:
            self.inst = <Instance>self._rt._instance(self, (), {})
        return self.inst

    def _drive(self):
        raise NotImplementedError

    def _demand(self):
        # bring the node up to date on its runtime; inside a running cell of that runtime the
        # read is recorded like any cell call
        rt = self._rt
        cur = current()
        if cur is rt:
            return Cell.__call__(self)
        _refuse_foreign(self, cur)
        return rt._demand_top(self.own())

    def __call__(self):
        return self._demand()

    cdef object refresh(self):
        # inside a running node: bring this node up to date, recording the read
        return demand(<Runtime>self._rt, self.own())

    def _refresh(self):
        return self.refresh()

    def __repr__(self):
        return f"<incr {type(self).__name__} {self.label}>"

    def _pull(self, MapBase up, long long seen, own):
        # the keys of `up` changed since log position `seen` go to _pending; returns the
        # position to remember
        up.refresh()
        log = up._log
        cdef long long start = up._log_start
        cdef long long end = start + len(log)
        if seen < start:     # first run, or fell behind a trimmed log: everything
            self._pending.update(up._data)
            self._pending.update(own() if callable(own) else own)
        elif seen < end:
            self._pending.update(log[seen - start:])
        return end


cdef class MapBase(NodeBase):
    """The compiled part of an incremental map (incr.collections.IncrMap)."""

    def __init__(self, rt, str label):
        NodeBase.__init__(self, rt, label, IDENTITY)   # a view is cached per change: `is`
        self._data = {}
        self._log = []
        self._log_start = 0
        self._sorted = None
        self._kind = None
        self._ran_from = 0
        self._vcache = None
        self._bulk_builds = 0
        self._seen = -1

    @property
    def _version(self):
        return self._log_start + len(self._log)

    def _since(self, long long pos):
        if pos < self._log_start:
            return None
        return self._log[pos - self._log_start:]

    def _emit(self, key):
        self.emit(key)

    cdef void emit(self, object key) except *:
        cdef list log = self._log
        cdef Py_ssize_t h
        log.append(key)
        if len(log) > LOG_MIN and len(log) > len(self._data):
            h = len(log) // 2
            del log[:h]
            self._log_start += h

    cpdef _check_kind(self, object key):
        kind = _key_kind(key, self.label)
        if self._kind is not None and self._data and kind != self._kind:
            raise TypeError(f"{self.label}: key {key!r} cannot be ordered with the map's "
                            f"other keys (all keys of a map are of one kind: numbers, "
                            f"str, bytes or tuples)")
        if kind == "tuple":
            _shape_merge(self._shape if self._data else None, <tuple>key, self.label, key)
        return kind

    def _put(self, key, value):
        return self.put(key, value)

    cdef bint put(self, object key, object value) except -1:
        cdef dict data = self._data
        cdef PyObject *old = PyDict_GetItem(data, key)
        if old == NULL:
            kind = self._check_kind(key)
            if self._kind is None or not data:
                self._kind = kind
                self._shape = None
            if kind == "tuple":
                self._shape = _shape_merge(self._shape, <tuple>key, self.label, key)
            self._sorted = None
        elif same_value(<object>old, value):     # (the rule a cell's cutoff uses)
            return False
        data[key] = value
        self.emit(key)
        return True

    def _del(self, key):
        return self.delete(key)

    cdef bint delete(self, object key) except -1:
        if self._data.pop(key, ABSENT) is ABSENT:
            return False
        self._sorted = None
        self.emit(key)
        return True

    def _sorted_keys(self):
        if self._sorted is None:
            self._sorted = sorted(self._data)
        return self._sorted

    def _view(self):
        return self.view()

    cdef MapView view(self):
        cdef long long v = self._log_start + len(self._log)
        cdef MapView c = <MapView>self._vcache
        if c is None or c._version != v:
            c = MapView.__new__(MapView)
            c._node = self
            c._version = v
            self._vcache = c
        return c

    cdef object refresh(self):
        if self._mode == M_INPUT:
            # a consumer reads the anchor itself: an input map is up to date by construction,
            # and its own cell need not run for every change
            return self._anchor_get()  # (Input.get, bound once: no attribute lookup per read)
        return demand(<Runtime>self._rt, self.own())

    cdef object drive(self):
        if self._mode == M_INPUT:
            self._anchor_get()
            self._ran_from = self._log_start + len(self._log)
            return self.view()
        if self._mode == M_OTHER:
            return self._drive()       # a Python node (join)
        return self.drive_one_up()

    def _drive(self):
        if self._mode == M_OTHER:
            raise NotImplementedError
        return self.drive()

    # -- one upstream: map, filter, map_keys, group_by -----------------------------------------

    def _fresh_build(self, rt, dict up):
        # the node is empty and must read every upstream key: built in one comprehension
        # where it can be (a plain function); False to go key by key
        cdef PerKeyFn pk = self._fn
        if pk.is_cell or self._mode not in (M_MAP, M_FILTER) or pk.ext_seen or pk.glob:
            return False
        reads = rt._reads()
        n0 = len(reads)
        fn = pk.fn
        if self._mode == M_MAP:
            data = {k: fn(k, v) for k, v in up.items()}
            _no_coroutines(self, data)
        else:
            data = {k: v for k, v in up.items() if fn(k, v)}
        if len(reads) > n0:
            pk.note(reads, n0)
        self._install(data)
        return True

    cdef bint fresh_cells(self, Runtime rt, dict up) except -1:
        # The cold build of map(cell) / filter(cell): the node is empty and every upstream key
        # needs its instance. One C loop over the upstream entries: each key's instance is
        # looked up (created) in the cell's table and, when it is new, run at once. For a new
        # instance of a plain sync cell, with no store, executor, running-ahead or lent work
        # in the pass, what demand() does (demand_cold -> ensure -> attempt -> run_in_stack)
        # comes down to run(): that is what is called. Anything else -- an instance that
        # exists already (another map of the same cell), one that failed in this pass --
        # goes through demand(). False (nothing done) when the build must go key by key:
        # a store (instances are looked up there), LLM or async cells, per-key state left
        # from an earlier content.
        cdef PerKeyFn pk = self._fn
        cdef Cell c = <Cell>pk.fn
        cdef int mode = self._mode
        if (mode != M_MAP and mode != M_FILTER) or pk.ext_seen or pk.glob or pk.key_inst \
                or pk.key_ext:
            return False
        if (rt.store is not None or rt.prefetch is not None or rt.executor is not None
                or rt.lent is not None or c.is_async or c.awaited or c.is_llm or c.is_effect):
            return False
        cdef dict table = table_for(rt, c)
        cdef Py_ssize_t n = len(up)
        if not table and n > 8:
            # the cell's first instances: its table sized once for every key, as the dicts
            # below (grown one insert at a time it resizes ~log2(n) times: ~130 instructions
            # an instance of a cold build). Nothing holds the table but rt.tables
            table = _PyDict_NewPresized(n)
            rt.tables[c] = table
        cdef dict uses = rt.extensions.get("incr.collections")
        if uses is None:
            uses = rt.extensions["incr.collections"] = _PyDict_NewPresized(n)
        # sized once for every key (a dict that grows to n entries copies them ~2n times)
        cdef dict key_inst = _PyDict_NewPresized(n)
        cdef dict data = _PyDict_NewPresized(n) if mode == M_MAP else {}
        cdef PyObject *pkey
        cdef PyObject *pval
        cdef PyObject *pu
        cdef Py_ssize_t pos = 0, nt
        cdef Instance inst
        cdef tuple args, deps
        cdef object key, value, v
        cdef long long q = quiet_enter(rt)   # untracked: the node does not depend on each
        cdef bint done = False
        try:
            while PyDict_Next(up, &pos, &pkey, &pval):
                key = <object>pkey
                value = <object>pval
                args = (key, value)
                if not PyObject_GC_IsTracked(key) and not PyObject_GC_IsTracked(value):
                    # what the collector does at its first look at such a tuple, done now: a
                    # cold build makes one per key, and each would be one more object for
                    # every collection to walk
                    PyObject_GC_UnTrack(args)
                nt = len(table)
                inst = lookup(rt, c, table, c.bound(args, NOKW), True)
                if len(table) > nt:
                    # created now: no flags, not failed, held by no map
                    run(rt, inst)        # what ensure() does for it: attempt() -> run()
                    v = inst.value
                    uses[inst] = 1
                else:
                    v = demand(rt, inst)
                    pu = PyDict_GetItem(uses, inst)
                    uses[inst] = 1 if pu == NULL else <object>pu + 1
                deps = inst.deps
                if deps:
                    pk.set_ext(key, deps)
                key_inst[key] = inst
                if mode == M_MAP:
                    data[key] = v
                elif v:
                    data[key] = value
            done = True
        finally:
            rt.quiet = q
            if not done:
                # cut short (the cell raised, a Ctrl-C): what ran stays known per key; every
                # key is computed again key by key at the next run (the ones that ran are hits)
                pk.key_inst = {k: i for k, i in key_inst.items() if i is not None}
                self._pending.update(up)
        pk.key_inst = key_inst       # (a cell never returns a coroutine: run() refuses it)
        self._install(data)
        self.track(rt)               # what the instances read besides their arguments
        return True

    def _install(self, dict data):
        # the whole content at once (the node was empty): the log restarts after it, so every
        # consumer, being behind it, reads everything
        cdef long long end = self._log_start + len(self._log)
        self._data = data
        self._kind = (<MapBase>self._up)._kind
        self._shape = (<MapBase>self._up)._shape
        self._sorted = None
        self._log = []
        self._log_start = end + len(data)
        self._bulk_builds += 1

    cdef object drive_one_up(self):
        cdef MapBase upn = <MapBase>self._up
        cdef PerKeyFn pk = self._fn
        cdef Runtime rt = <Runtime>self._rt
        cdef list ulog
        cdef long long ustart, uend, seen
        cdef object pending
        cdef dict up, results
        cdef PyObject *pv
        cdef int mode = self._mode
        self._ran_from = self._log_start + len(self._log)
        upn.refresh()
        ulog = upn._log
        ustart = upn._log_start
        uend = ustart + len(ulog)
        seen = self._seen
        pending = self._pending
        if (seen == uend - 1 and seen >= ustart and mode != M_HOOKS and not pending
                and not pk.ext_seen and not pk.glob):
            # one key changed upstream (the common case): computed, then applied
            self._seen = uend
            key = ulog[seen - ustart]
            pv = PyDict_GetItem(upn._data, key)
            if pv == NULL:
                self.apply_one(key, ABSENT)
            else:
                try:
                    r = self.compute(rt, key, <object>pv)
                    self.apply_one(key, r)      # (a value's == is the user's code too)
                except BaseException:
                    PySet_Add(pending, key)     # computed again at the next run
                    raise
            return self.view()
        if seen < ustart:     # first run, or fell behind a trimmed log: everything
            if not self._data and (self.fresh_cells(rt, upn._data) if pk.is_cell
                                   else self._fresh_build(rt, upn._data)):
                self._seen = uend
                return self.view()
            pending.update(upn._data)
            pending.update(self._data)
        elif seen == uend - 1:
            PySet_Add(pending, ulog[seen - ustart])
        elif seen < uend:
            pending.update(ulog[seen - ustart:])
        self._seen = uend
        if pk.ext_seen or pk.glob:
            pending.update(pk.check(rt, upn._data))
        if not pending:
            self.track(rt)
            return self.view()
        up = upn._data
        if mode != M_HOOKS and len(pending) == 1:
            # one changed key (the common case): computed, then applied
            for key in pending:
                break
            pv = PyDict_GetItem(up, key)
            if pv == NULL:
                self.apply_one(key, ABSENT)
            else:
                self.apply_one(key, self.compute(rt, key, <object>pv))
            pending.clear()
            self.track(rt)
            return self.view()
        results = {}
        deferred = None
        # phase 1: compute (may raise: nothing changed yet, the keys stay pending)
        for key in pending:
            pv = PyDict_GetItem(up, key)
            if pv == NULL:
                results[key] = ABSENT
                continue
            try:
                if mode == M_HOOKS:
                    results[key] = self._compute(key, <object>pv)
                else:
                    results[key] = self.compute(rt, key, <object>pv)
            except _Deferred as e:   # an LLM generation set aside to run concurrently
                if deferred is None:
                    deferred = e
        if deferred is not None:
            raise deferred
        # phase 2: apply
        if mode == M_HOOKS:
            self._apply(results)
        else:
            for key, r in results.items():
                self.apply_one(key, r)
        self._pending = set()   # (a drained large set would be scanned by the next pop)
        self.track(rt)
        return self.view()

    cdef object compute(self, Runtime rt, object key, object value):
        # map / filter: the new entry, or ABSENT
        r = self._fn.call(rt, key, (key, value))
        if self._mode == M_FILTER:
            return value if r else ABSENT
        return r

    cdef void apply_one(self, object key, object r) except *:
        if r is ABSENT:
            self.delete(key)
            if PyDict_GetItem((<MapBase>self._up)._data, key) == NULL:
                # gone upstream: its instance goes too. (A key a filter leaves out is still
                # there: its predicate instance and what it read stay, so that a change
                # there brings the key back.)
                self._fn.drop(key)
        else:
            self.put(key, r)

    cdef void track(self, Runtime rt) except *:
        # what the instances run in this pass read is a dependency of the map from now on
        ext = self._fn.ext_seen
        if ext:
            for dep in ext:
                rt._read(dep)

    def _track(self, rt):
        self.track(<Runtime?>rt)


cdef inline object _last(MapBase m, object key, object old):
    # what a set of an input map's `key` (holding `old`) is compared with
    cdef PyObject *s
    if m._shadow:
        s = PyDict_GetItem(m._shadow, key)
        if s != NULL:
            return <object>s
    return old


cdef inline object _copy_of(object value):
    # what an input map keeps of `value`: (its own copy,) if it is mutable, else None. The
    # copy may run Python code (incr.keys.own_args, a registered type's codec): a change
    # makes it before its first step (coll5: an interrupt there changes nothing)
    cdef type t = type(value)
    if t is int or t is str or t is float or t is bool:     # (the common values: no call)
        return None
    return own_copy(value)


cdef void _keep(MapBase m, object key, object value) except *:
    # an input map's `key` now holds `value`: keep the map's own copy of it if it is mutable
    _keep_copy(m, key, _copy_of(value))


cdef void _keep_copy(MapBase m, object key, object o) except *:
    # _keep with the copy made (_copy_of): no Python code runs
    if o is not None:
        if m._shadow is None:
            m._shadow = {}
        m._shadow[key] = (<tuple>o)[0]
    elif m._shadow:
        m._shadow.pop(key, None)


cdef class InputMapBase(MapBase):
    """The compiled part of an incremental input map (incr.collections.InputMap). (No cdef
    methods here: InputMap's instances are laid out, and get the vtable, of MapBase.)

    Like an Input, it keeps its own copy of a mutable value (a list, dict, tuple holding
    them, a registered type: own_copy, the copy a cell keeps of its arguments) and compares
    the next set of that key with the copy: mutating the object given, or the one get()
    returned, then setting it again is a change. A change made while another thread's pass
    is running is made when that pass ends, as the next revision (CONCURRENCY.md rule 1)."""

    def _keep_all(self):
        # the initial content: a copy of each mutable value (a C loop: the common values,
        # ints and strs, cost a type test each)
        cdef PyObject *key
        cdef PyObject *val
        cdef Py_ssize_t pos = 0
        cdef list todo = None
        while PyDict_Next(self._data, &pos, &key, &val):
            t = type(<object>val)
            if t is int or t is str or t is float or t is bool or t is bytes or <object>val is None:
                continue
            if todo is None:
                todo = []
            todo.append(<object>key)
        if todo is not None:
            for k in todo:
                _keep(self, k, self._data[k])

    def set(self, key, value):
        """Give ``key`` the value ``value`` (adding it). The same value changes nothing."""
        cdef dict data = self._data
        cdef PyObject *old = PyDict_GetItem(data, key)
        cdef long long n
        if old != NULL:
            if same_value(_last(self, key, <object>old), value):
                return
        else:
            try:
                self._check_kind(key)
            except (TypeError, ValueError):   # not a key (unhashable, NaN): say which map
                _key_kind(key, f"input_map {self.label!r}: set")
                raise
        cdef Runtime rt = (<Input>self._anchor).rt
        if deferring(rt) or (self._key_inputs and key in self._key_inputs):
            return self._apply({key: value}, ())
        o = _copy_of(value)     # (Python code may run: before anything changes)
        # one set of the anchor is one revision: no batch needed (the set raises
        # ReentrancyError inside a computation, before anything changed)
        n = self._stamp + 1
        cdef Stamp st = Stamp.__new__(Stamp)
        st.n = n
        set_input(rt, <Input>self._anchor, st)
        self._stamp = n
        _keep_copy(self, key, o)
        if old == NULL:
            self.put(key, value)
            return
        data[key] = value
        self.emit(key)

    def _apply(self, dict sets, dels):
        """Set every (key, value) of ``sets`` and remove every key of ``dels`` that is there
        (a key in both ends up removed), as one revision; all or nothing: every key is checked
        first, and from the first change to the last nothing calls back into Python but the
        values' own comparisons. During another thread's pass: done when it ends.

        (coll5) Everything that may run Python code -- the values' comparisons, the copies of
        mutable values (incr.keys, a registered type's codec) -- is done before the first
        change; from the first change to the last no Python code runs (the per-key inputs are
        set with the copies made: set_input_owned), so a Ctrl-C, which lands only where
        Python code runs, cannot split the change."""
        cdef dict data = self._data
        cdef Runtime rt = (<Input>self._anchor).rt
        cdef Input inp
        cdef long long n
        cdef Py_ssize_t j
        cdef PyObject *old
        if deferring(rt):
            # the values as they are now (the caller may change its objects afterwards)
            owned = {}
            for k, v in sets.items():
                o = own_copy(v)
                owned[k] = v if o is None else (<tuple>o)[0]
            if defer_op(rt, lambda: self._apply(owned, dels)):
                return
        gone = set(dels)
        changed = []
        kind = None
        shape = None
        for k, v in sets.items():
            if k in gone:
                continue
            old = PyDict_GetItem(data, k)
            if old != NULL:
                if not same_value(_last(self, k, <object>old), v):
                    changed.append((k, v))
                continue
            # a new key: a key, of the map's kind (checked before anything changes)
            kk = _key_kind(k, f"input_map {self.label!r}: update")
            want = self._kind if data and self._kind is not None else kind
            if want is not None and kk != want:
                raise TypeError(f"input_map {self.label!r}: update: key {k!r} cannot be "
                                f"ordered with the map's other keys (all keys of a map are "
                                f"of one kind: numbers, str, bytes or tuples); nothing was "
                                f"changed")
            kind = kk
            if kk == "tuple":
                shape = _shape_merge(shape if shape is not None else (self._shape if data
                                     else None), <tuple>k, f"input_map {self.label!r}: update",
                                     k)
            changed.append((k, v))
        dropped = [k for k in gone if k in data]
        if not changed and not dropped:
            return
        copies = [_copy_of(v) for k, v in changed]
        rt._batch_enter()          # raises ReentrancyError inside a computation
        try:
            n = self._stamp + 1
            st = Stamp.__new__(Stamp)
            (<Stamp>st).n = n
            set_input(rt, <Input>self._anchor, st)   # (the same inside a stabilization)
            self._stamp = n
            keyed = self._key_inputs
            for j in range(len(changed)):
                k, v = changed[j]
                o = copies[j]
                _keep_copy(self, k, o)
                if k in data:
                    data[k] = v        # (not put: it would take a mutated object as the same)
                    self.emit(k)
                else:
                    self.put(k, v)
                if keyed:
                    i = keyed.get(k)
                    if i is not None:
                        # it holds the key's old value, which differs from v (above): set
                        # without comparing or copying again (no Python code)
                        set_input_owned(rt, <Input>i, v, o)
            for k in dropped:
                if self._shadow:
                    self._shadow.pop(k, None)
                self.delete(k)
                if keyed:
                    i = keyed.get(k)
                    if i is not None:
                        set_input(rt, <Input>i, ABSENT)
        finally:
            rt._batch_exit()


cdef class FoldBase(NodeBase):
    """The compiled part of a fold (incr.collections.Fold): its run."""

    def _drive(self):
        return self.drive()

    cdef object drive(self):
        cdef MapBase up = self._up
        cdef list ulog, keys
        cdef long long ustart, uend, seen
        cdef dict data
        cdef PyObject *pv
        cdef Py_ssize_t i = 0
        cdef object tree = self._tree
        up.refresh()
        if tree is None and self._kindname == "count":
            return len(up._data)
        ulog = up._log
        ustart = up._log_start
        uend = ustart + len(ulog)
        seen = self._seen
        data = up._data
        if type(tree) is SumFold and seen == uend - 1 and seen >= ustart and not self._pending:
            # one changed key of a sum: one compiled update
            self._seen = uend
            key = ulog[seen - ustart]
            pv = PyDict_GetItem(data, key)
            try:
                if pv == NULL:
                    (<SumFold>tree).delete(key)
                else:
                    (<SumFold>tree).set(key, <object>pv)
            except BaseException:
                self._pending.add(key)    # waits for the next run
                raise
            return (<SumFold>tree).cvalue()
        if seen < ustart:    # first run, or fell behind a trimmed log: everything
            if type(tree) is SumFold and len(tree) == 0 and not self._pending:
                tree.load(data)          # compiled, in one pass
                self._seen = uend
                return (<SumFold>tree).cvalue()
            self._pending.update(data)
            self._pending.update(self._own_keys())
        elif seen < uend:
            self._pending.update(ulog[seen - ustart:])
        self._seen = uend
        keys = list(self._pending)
        # a fresh set (popping a drained large set scans its whole table)
        self._pending = set()
        try:
            if tree is not None:
                keyfn = self._keyfn if self._kindname == "top_k" else None
                for i in range(len(keys)):
                    key = keys[i]
                    pv = PyDict_GetItem(data, key)
                    if pv == NULL:
                        tree.delete(key)
                    elif keyfn is not None:
                        tree.set(key, <object>pv, keyfn(<object>pv))
                    else:
                        tree.set(key, <object>pv)
                return tree.value
            # fold(add, remove, init): one key at a time, committed as it goes
            vals = self._vals
            for i in range(len(keys)):
                key = keys[i]
                acc = self._acc
                old = vals.get(key, ABSENT)
                pv = PyDict_GetItem(data, key)
                if old is not ABSENT:
                    acc = self._remove(acc, key, old)
                if pv != NULL:
                    acc = self._add(acc, key, <object>pv)
                    vals[key] = <object>pv
                else:
                    vals.pop(key, None)
                self._acc = acc
            return self._acc
        except BaseException:
            self._pending.update(keys[i:])    # the rest waits for the next run
            raise
