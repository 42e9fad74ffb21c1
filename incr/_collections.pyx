# cython: language_level=3
"""Compiled part of incr.collections: FoldTree, an aggregate-maintaining treap.

Keys are kept in order (they must be mutually orderable); each node holds the aggregate of its
subtree, so the total is the root's aggregate. ``set``/``delete`` of one key touch one root path
(expected O(log n) nodes). Aggregates combine left subtree, the node, right subtree in key
order, so ``reduce(op)`` needs ``op`` associative only (not commutative).
"""

cimport cython
from cpython.object cimport PyObject_RichCompareBool, Py_LT, Py_GT
from cpython.dict cimport PyDict_GetItem, PyDict_SetItem, PyDict_DelItem
from cpython.ref cimport PyObject
from heapq import heapify, heappop, heappush

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

    cpdef set(self, object key, object value, object sk=None):
        """Give ``key`` the value ``value`` (adding the key if new). O(log n) expected."""
        cdef TNode n = self.index.get(key)
        cdef TNode cur, nxt
        if n is not None:
            n.value = value
            if self.kind == K_TOPK:
                n.sk = (value if sk is None else sk, key, value)
            self.fix_up(n)
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

    cpdef bint delete(self, object key) except -1:
        """Remove ``key``; False if it was not there. O(log n) expected."""
        cdef TNode n = self.index.pop(key, None)
        cdef TNode c, p
        if n is None:
            return False
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
        return True

    @property
    def value(self):
        """The aggregate of every value (key order), or the empty tree's value."""
        if self.root is None:
            return self.identity
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

    @property
    def value(self):
        """The sum of every value, or the identity when there is none."""
        if self.tree is not None:
            return self.tree.value
        if not self.vals:
            return self.identity
        return self.total

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
