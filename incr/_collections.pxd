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

    cdef unsigned int next_prio(self)
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
