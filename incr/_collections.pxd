# The compiled part of incr.collections: a balanced search tree (a treap) keyed by a map's keys,
# each node holding its key's value and the aggregate of its subtree. Changing, adding or removing
# one key recomputes the aggregates on one root path: O(log n) expected, with no Python-level call
# per tree level for the built-in kinds (sum, min, max, top_k: C-API arithmetic and comparisons).
# A `reduce(op)` tree calls `op` once per level (it is the user's function).

cdef enum FoldKind:
    K_SUM = 0
    K_MIN = 1
    K_MAX = 2
    K_REDUCE = 3
    K_TOPK = 4


cdef class TNode:
    cdef object key
    cdef object value
    cdef object sk                   # top_k: the sort key of value (key(value) or value)
    cdef object agg                  # aggregate of the subtree rooted here
    cdef TNode left, right
    cdef void *parent                # borrowed: a node is owned by its parent (or the tree)
    cdef unsigned int prio


cdef class FoldTree:
    cdef TNode root
    cdef dict index                  # key -> TNode
    cdef int kind
    cdef object op                   # K_REDUCE: op(a, b)
    cdef object identity             # the value of the empty tree
    cdef Py_ssize_t k                # K_TOPK
    cdef unsigned long long rng
    cdef bint dirty                  # an exception cut a set / delete short: repair() first

    cdef unsigned int next_prio(self)
    cdef void repair(self) except *
    cdef void pull(self, TNode n) except *
    cdef void fix_up(self, TNode n) except *
    cdef void rotate_up(self, TNode x) except *
    cpdef set(self, object key, object value, object sk=*)
    cpdef bint delete(self, object key) except -1


cdef class SumFold:
    cdef dict vals                   # int mode: key -> value, else None
    cdef object total                # int mode: the sum of vals' values
    cdef FoldTree tree               # tree mode (a value that is not an int arrived), else None
    cdef object identity             # the value of the empty sum
    cdef readonly long long n_delta, n_tree

    cdef void to_tree(self) except *
    cpdef set(self, object key, object value)
    cpdef bint delete(self, object key) except -1
    cdef object cvalue(self)


cdef class MinMaxFold:
    cdef bint is_max
    cdef dict vals                   # int mode: key -> value, else None
    cdef dict counts                 # int mode: value -> number of keys holding it
    cdef list heap                   # int mode: values (negated for max), stale ones included
    cdef FoldTree tree               # tree mode (a value that is not an int arrived), else None
    cdef object identity
    cdef readonly long long n_heap, n_tree

    cdef void to_tree(self) except *
    cdef void drop_value(self, object v) except *
    cdef void maybe_rebuild(self) except *
    cpdef set(self, object key, object value)
    cpdef bint delete(self, object key) except -1


# ---- the collection nodes (incr.collections' classes derive from these) -------------------
# A node is an incr cell with no arguments; the engine runs it through Cell.invoke, which a
# node overrides to call its compiled _drive (no Python frame per run). The per-key work of
# map / filter (plain function or incr cell) and of the folds is compiled here; the other
# operators (map_keys, join, group_by) override the _compute/_apply hooks in Python.

from incr._core cimport Cell, Runtime, Instance, Node, Input, Frame


cdef class PerKeyFn:
    cdef public object node
    cdef public object fn
    cdef public bint is_cell
    cdef public dict key_ext          # key -> deps of its instance (cells), if any
    cdef public dict ext_keys         # dep -> set of keys whose instance read it
    cdef public dict ext_seen         # dep -> its changed_at when last looked at
    cdef public dict glob             # plain fn: dep -> changed_at
    cdef public dict key_inst         # cells: key -> the instance demanded for it
    cdef public long long n_dropped   # instances withdrawn (deleted or superseded keys)

    cdef object call(self, Runtime rt, object key, tuple args)
    cdef void note(self, list reads, Py_ssize_t n0) except *
    cdef void set_ext(self, object key, tuple deps) except *
    cpdef drop(self, object key)


cdef class NodeBase(Cell):
    cdef public object _rt
    cdef public str label
    cdef public object _pending       # set: keys to recompute at the next run
    cdef Instance inst                # this node's instance in _rt, once looked up

    cdef Instance own(self)
    cdef object invoke(self, tuple args)
    cdef object drive(self)           # the run (compiled; a Python subclass overrides _drive)
    cdef object refresh(self)         # inside a running node: bring this one up to date


cdef class MapView:
    cdef readonly MapBase _node
    cdef readonly long long _version


cdef class MapBase(NodeBase):
    cdef public dict _data
    cdef public list _log
    cdef public long long _log_start
    cdef public object _sorted
    cdef public object _kind
    cdef public object _shape         # tuple keys: each position's kind (_shape_merge), or None
    cdef public long long _ran_from
    cdef public object _vcache
    cdef public long long _bulk_builds
    cdef public int _mode             # M_* in _collections.pyx
    # one upstream (map, filter, map_keys, group_by)
    cdef public object _up
    cdef public long long _seen
    cdef public PerKeyFn _fn
    # an input map
    cdef public long long _stamp
    cdef public object _anchor
    cdef public object _anchor_get     # _anchor.get, bound once
    cdef public dict _key_inputs
    cdef public dict _shadow         # key -> the map's own copy of a mutable value, or None

    cdef bint put(self, object key, object value) except -1
    cdef bint delete(self, object key) except -1
    cdef void emit(self, object key) except *
    cdef MapView view(self)
    cpdef _check_kind(self, object key)
    cdef object drive_one_up(self)
    cdef bint fresh_cells(self, Runtime rt, dict up) except -1
    cdef object compute(self, Runtime rt, object key, object value)
    cdef void apply_one(self, object key, object r) except *
    cdef void track(self, Runtime rt) except *


cdef class FoldBase(NodeBase):
    cdef public MapBase _up
    cdef public long long _seen
    cdef public str _kindname
    cdef public object _keyfn, _add, _remove, _acc
    cdef public dict _vals
    cdef public object _tree


cdef class InputMapBase(MapBase):
    pass   # (no cdef methods: InputMap's instances get MapBase's vtable, see _collections.pyx)


