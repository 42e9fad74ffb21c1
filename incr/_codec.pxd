# The record codec (internal): stored records, their checksum (XXH64), the index's nodes, and
# the common argument and value encodings read in place. incr/_codec.pyx implements it; the
# engine (incr/_core.pyx) cimports it. Layout of a record and of the index: incr/store.py.
#
# Contract:
#   - nothing here pickles, marshals or evaluates what it reads; a reader raises ValueError
#     (only) on bytes that are not sound, and the engine treats that as a miss;
#   - a Record is checked before it exists (header, length, checksum, then every offset and
#     string), so the per-dependency helpers below index it without checking again;
#   - nothing here knows the engine's types (Node, Instance, Runtime): the engine-side helpers
#     that compare a record's dependency with a node (_dep_names) stay in the engine.
# Per-record calls (_read_record, _pack_record, _decode_at, ...) cross the module boundary
# through Cython's C-API table; the per-dependency ones are `inline` here and compile into the
# engine.

from libc.stdint cimport uint64_t
from libc.string cimport memcmp

cdef extern from "Python.h":
    object PyUnicode_DecodeUTF8(const char *s, Py_ssize_t size, const char *errors)
    object PyBytes_FromStringAndSize(const char *v, Py_ssize_t len)
    char *PyBytes_AS_STRING(object o)
    double PyFloat_Unpack4(const char *p, int le) except? -1.0
    double PyFloat_Unpack8(const char *p, int le) except? -1.0


cdef class Record:
    # One stored record, checked (header, checksum, layout) and held undecoded: fields are
    # offsets into `data`, decoded when used. Not tracked by the cyclic collector (holds bytes
    # only).
    cdef readonly bytes key          # entry key: instance key + trace hash
    cdef bytes data                  # the whole record, header included
    cdef readonly long long run      # the run that wrote it
    cdef Py_ssize_t strs_at, nstr    # the string table (cell identity, label, dependency
                                     # names): its offset and length
    cdef Py_ssize_t cell, label      # indexes into it
    cdef Py_ssize_t args_at, val_at, vh_at   # offsets of blobs (u32 length, then bytes)
    cdef Py_ssize_t ndeps
    cdef Py_ssize_t *deps_at         # offset of each dependency


# --- per dependency: inline (compiled into every module that cimports this) -----------------

cdef inline Py_ssize_t _u32(const unsigned char *p) nogil:
    return (<Py_ssize_t>p[0] << 24) | (<Py_ssize_t>p[1] << 16) | (<Py_ssize_t>p[2] << 8) | p[3]


cdef inline bytes _blob_bytes(bytes data, Py_ssize_t at):
    # the blob (u32 length, bytes) at `at`, as bytes
    cdef const unsigned char *p = <const unsigned char *>PyBytes_AS_STRING(data)
    return PyBytes_FromStringAndSize(<const char *>p + at + 4, _u32(p + at))


cdef inline bint _blob_equals(bytes data, Py_ssize_t at, bytes other):
    # whether the blob at `at` holds exactly `other`
    cdef const unsigned char *p = <const unsigned char *>PyBytes_AS_STRING(data)
    cdef Py_ssize_t n = _u32(p + at)
    return n == len(other) and memcmp(p + at + 4, PyBytes_AS_STRING(other), n) == 0


cdef inline Py_ssize_t _dep_hash_at(Record r, Py_ssize_t i):
    # offset of dependency i's hash blob
    cdef const unsigned char *p = <const unsigned char *>PyBytes_AS_STRING(r.data)
    cdef Py_ssize_t at = r.deps_at[i] + 5
    if p[at - 5] == 0x63:   # 'c': skip args and instance key
        at += 4 + _u32(p + at)
        at += 4 + _u32(p + at)
    return at


# --- per record ------------------------------------------------------------------------------

cdef uint64_t _xxh64(const unsigned char *p, Py_ssize_t n) noexcept nogil   # XXH64, seed 0
cdef str _rec_str(Record r, Py_ssize_t index)      # string `index` of r's string table
cdef Record _read_record(bytes key, object data)   # check bytes, make a Record (ValueError only)
cdef bytes _pack_record(str ident, str label, bytes args, bytes val, bytes vh, list deps,
                        long long run)             # the writer; deps: ("i", name, hash) or
                                                   # ("c", identity, args, instance key, hash)
cdef bytes _index_step(bytes node, bytes kind, bytes ref, bytes h)   # the next index node
cdef list _index_nodes(bytes ikey, bytes entry, list deps)   # an entry's index nodes (k, v)
cdef object _decode_simple(bytes data, Py_ssize_t at, Py_ssize_t n)   # a common encoding read
                                                   # in place, or NOT_SIMPLE (a module attribute)
cdef object _decode_at(bytes data, Py_ssize_t at, Py_ssize_t n)   # the value (keys.decode for
                                                   # the rest); keys.DecodeError on bad bytes
cdef void _add_usage_tag(bytearray tags, bytes key) except *   # one hit, for the usage log
cdef bytes _instance_key(str ident, bytes args, str algorithm)   # keys.instance_key, fast
cdef bytes _encode_simple(object v)   # keys.encode(v) of a simple value or a flat tuple of
                                      # them (byte for byte), else None
cdef bytes _digest(str domain, bytes tag, bytes payload, str algorithm)   # keys.digest, fast
cdef bytes _trace_bytes(list stored)  # msgpack of the trace's references (record's deps form),
                                      # or None (a name that is not UTF-8)
