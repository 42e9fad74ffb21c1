# cython: language_level=3
"""The record codec (internal): stored records, XXH64, the index's nodes, the common
encodings read in place. The contract is in _codec.pxd; the layout in incr/store.py."""

cimport cython
from incr import keys as _keys

# --- stored records (format 2; layout in incr/store.py) ------------------------------------
#
# The reader checks everything before anything is used: header, length, checksum, then the
# layout (every length and index in bounds, every string valid UTF-8, the body consumed
# exactly). A Record keeps offsets into the checked bytes, so nothing per dependency is decoded
# until the engine asks for it. Nothing here pickles, marshals or evaluates what it reads.

from libc.string cimport memcpy
from cpython.bytearray cimport PyByteArray_Resize, PyByteArray_AS_STRING
from libc.stdlib cimport malloc, free
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint64_t
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from cpython.ref cimport Py_INCREF
cdef extern from "Python.h":
    void PyObject_GC_UnTrack(object o)
    const char *PyUnicode_AsUTF8AndSize(object s, Py_ssize_t *size) except NULL
    Py_ssize_t PyBytes_GET_SIZE(object o)
    int PyFloat_Pack8(double x, char *p, int le) except -1
    long long PyLong_AsLongLongAndOverflow(object o, int *overflow) except? -1

import struct as _struct
from incr.store import FORMAT as _RECORD_FORMAT, MAGIC as _MAGIC, KIND_CELL as _KIND_CELL, \
    MAX_RECORD as _MAX_RECORD

cdef Py_ssize_t HEAD = 16
cdef int REC_FORMAT = _RECORD_FORMAT
cdef int REC_KIND = _KIND_CELL
cdef Py_ssize_t REC_MAX = _MAX_RECORD


cdef inline uint64_t _u64(const unsigned char *p) nogil:
    cdef uint64_t v = 0
    cdef int i
    for i in range(8):
        v = (v << 8) | p[i]
    return v


# XXH64 (xxHash's 64-bit hash, seed 0): the records' checksum, computed here on the record
# buffer; keys.checksum gives the same through the xxhash package (tests check they agree).
cdef uint64_t _P1 = 0x9E3779B185EBCA87ULL
cdef uint64_t _P2 = 0xC2B2AE3D27D4EB4FULL
cdef uint64_t _P3 = 0x165667B19E3779F9ULL
cdef uint64_t _P4 = 0x85EBCA77C2B2AE63ULL
cdef uint64_t _P5 = 0x27D4EB2F165667C5ULL


cdef inline uint64_t _rotl(uint64_t x, int r) nogil:
    return (x << r) | (x >> (64 - r))


cdef inline uint64_t _le64(const unsigned char *p) nogil:
    cdef uint64_t v = 0
    cdef int i
    for i in range(7, -1, -1):
        v = (v << 8) | p[i]
    return v


cdef inline uint64_t _le32(const unsigned char *p) nogil:
    return (<uint64_t>p[0]) | (<uint64_t>p[1] << 8) | (<uint64_t>p[2] << 16) \
        | (<uint64_t>p[3] << 24)


cdef inline uint64_t _xxround(uint64_t acc, uint64_t v) nogil:
    acc = acc + v * _P2
    acc = _rotl(acc, 31)
    return acc * _P1


cdef inline uint64_t _xxmerge(uint64_t acc, uint64_t v) nogil:
    acc = acc ^ _xxround(0, v)
    return acc * _P1 + _P4


cdef uint64_t _xxh64(const unsigned char *p, Py_ssize_t n) noexcept nogil:
    cdef const unsigned char *end = p + n
    cdef uint64_t v1, v2, v3, v4, h
    if n >= 32:
        v1 = _P1 + _P2
        v2 = _P2
        v3 = 0
        v4 = 0 - _P1
        while p + 32 <= end:
            v1 = _xxround(v1, _le64(p))
            v2 = _xxround(v2, _le64(p + 8))
            v3 = _xxround(v3, _le64(p + 16))
            v4 = _xxround(v4, _le64(p + 24))
            p += 32
        h = _rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)
        h = _xxmerge(h, v1)
        h = _xxmerge(h, v2)
        h = _xxmerge(h, v3)
        h = _xxmerge(h, v4)
    else:
        h = _P5
    h += <uint64_t>n
    while p + 8 <= end:
        h = h ^ _xxround(0, _le64(p))
        h = _rotl(h, 27) * _P1 + _P4
        p += 8
    if p + 4 <= end:
        h = h ^ (_le32(p) * _P1)
        h = _rotl(h, 23) * _P2 + _P3
        p += 4
    while p < end:
        h = h ^ (p[0] * _P5)
        h = _rotl(h, 11) * _P1
        p += 1
    h = h ^ (h >> 33)
    h = h * _P2
    h = h ^ (h >> 29)
    h = h * _P3
    h = h ^ (h >> 32)
    return h


def record_checksum(bytes payload):
    """The checksum the record reader computes (for tests: must equal keys.checksum)."""
    return _xxh64(<const unsigned char *>PyBytes_AS_STRING(payload), len(payload)).to_bytes(
        8, "big")


cdef inline Py_ssize_t _blob(const unsigned char *p, Py_ssize_t at, Py_ssize_t end) except -2:
    # the offset after the blob (u32 length, bytes) at `at`; ValueError if it overruns `end`
    cdef Py_ssize_t n
    if at + 4 > end:
        raise ValueError("truncated length field")
    n = _u32(p + at)
    if n > end - at - 4:
        raise ValueError("a field overruns the record")
    return at + 4 + n


cdef bint _utf8_valid(const unsigned char *s, Py_ssize_t n) nogil:
    # exactly what Python's strict UTF-8 decoder accepts: no overlong forms, no surrogates,
    # nothing above U+10FFFF
    cdef Py_ssize_t i = 0, j, more
    cdef unsigned char c, c1
    while i < n:
        c = s[i]
        if c < 0x80:
            i += 1
            continue
        if 0xc2 <= c <= 0xdf:
            more = 1
        elif 0xe0 <= c <= 0xef:
            more = 2
        elif 0xf0 <= c <= 0xf4:
            more = 3
        else:
            return False
        if n - i <= more:
            return False
        c1 = s[i + 1]
        if (c == 0xe0 and c1 < 0xa0) or (c == 0xed and c1 > 0x9f) \
                or (c == 0xf0 and c1 < 0x90) or (c == 0xf4 and c1 > 0x8f):
            return False
        for j in range(1, more + 1):
            if (s[i + j] & 0xc0) != 0x80:
                return False
        i += more + 1
    return True


cdef str _rec_str(Record r, Py_ssize_t index):
    # string `index` of r's string table (checked by _read_record: in range, UTF-8)
    cdef const unsigned char *p = <const unsigned char *>PyBytes_AS_STRING(r.data)
    cdef Py_ssize_t at = r.strs_at
    cdef Py_ssize_t k
    for k in range(index):
        at += 4 + _u32(p + at)
    return PyUnicode_DecodeUTF8(<const char *>p + at + 4, _u32(p + at), "strict")


def utf8_valid(bytes data):
    """Whether the record reader takes ``data`` as UTF-8 (for tests)."""
    return _utf8_valid(<const unsigned char *>PyBytes_AS_STRING(data), len(data))


@cython.no_gc
cdef class Record:
    """A checked stored record (internal). ``read_record`` makes one; ``as_dict`` shows it."""
    # (not tracked by the cyclic collector: it holds bytes only)

    def __dealloc__(self):
        if self.deps_at != NULL:
            free(self.deps_at)

    def as_dict(self):
        """{cell, label, args, val, vh, run, deps: [[kind, ref, hash], ...]}: an input
        dependency's ref is its name, a cell dependency's is [identity, args, instance key]."""
        cdef Py_ssize_t i
        deps = []
        for i in range(self.ndeps):
            deps.append(_dep_as_list(self, i))
        return {"cell": _rec_str(self, self.cell), "label": _rec_str(self, self.label),
                "args": _blob_bytes(self.data, self.args_at),
                "val": _blob_bytes(self.data, self.val_at),
                "vh": _blob_bytes(self.data, self.vh_at), "deps": deps, "run": self.run}


cdef list _dep_as_list(Record r, Py_ssize_t i):
    cdef const unsigned char *p = <const unsigned char *>PyBytes_AS_STRING(r.data)
    cdef Py_ssize_t at = r.deps_at[i]
    name = _rec_str(r, _u32(p + at + 1))
    at += 5
    if p[at - 5] == 0x69:   # 'i'
        return ["i", name, _blob_bytes(r.data, at)]
    args = _blob_bytes(r.data, at)
    at += 4 + _u32(p + at)
    ikey = _blob_bytes(r.data, at)
    at += 4 + _u32(p + at)
    return ["c", [name, args, ikey], _blob_bytes(r.data, at)]


cdef Record _read_record(bytes key, object data):
    """Check ``data`` and return it as a Record; ValueError (only) if it is not sound."""
    cdef Record r
    cdef const unsigned char *p
    cdef Py_ssize_t n, end, at, i, nstr, k, ndeps
    if type(data) is not bytes:
        data = bytes(data)
    n = len(<bytes>data)
    p = <const unsigned char *>PyBytes_AS_STRING(data)
    if n < HEAD:
        raise ValueError("shorter than a header")
    if p[0] != 0x69 or p[1] != 0x52:  # b"iR"
        raise ValueError("not an incr record")
    if p[2] != REC_FORMAT:
        raise ValueError(f"record format {p[2]}, this incr reads {REC_FORMAT}")
    if p[3] != REC_KIND:
        raise ValueError(f"record kind {p[3]} is unknown")
    if _u32(p + 4) > REC_MAX or _u32(p + 4) != n - HEAD:
        raise ValueError("length field does not match")
    if _xxh64(p + HEAD, n - HEAD) != _u64(p + 8):
        raise ValueError("checksum mismatch")
    r = Record.__new__(Record)
    r.key = key
    r.data = <bytes>data
    end = n
    at = HEAD
    if at + 12 > end:
        raise ValueError("truncated body")
    if _u64(p + at) > <uint64_t>0x7fffffffffffffff:
        raise ValueError("run number out of range")
    r.run = <long long>_u64(p + at)
    nstr = _u32(p + at + 8)
    at += 12
    if nstr > end - at:
        raise ValueError("string table overruns the record")
    r.strs_at = at
    r.nstr = nstr
    for k in range(nstr):
        i = _blob(p, at, end)
        if not _utf8_valid(p + at + 4, i - at - 4):
            raise ValueError("a string is not UTF-8")
        at = i
    if at + 8 > end:
        raise ValueError("truncated body")
    r.cell = _u32(p + at)
    r.label = _u32(p + at + 4)
    if r.cell >= nstr or r.label >= nstr:
        raise ValueError("string index out of range")
    at += 8
    r.args_at = at
    at = _blob(p, at, end)
    r.val_at = at
    at = _blob(p, at, end)
    r.vh_at = at
    at = _blob(p, at, end)
    if at + 4 > end:
        raise ValueError("truncated body")
    ndeps = _u32(p + at)
    at += 4
    if ndeps > (end - at) // 9:   # a dependency takes at least 9 bytes
        raise ValueError("dependency count overruns the record")
    r.deps_at = <Py_ssize_t *>malloc((ndeps if ndeps else 1) * sizeof(Py_ssize_t))
    if r.deps_at == NULL:
        raise MemoryError()
    for k in range(ndeps):
        if at + 5 > end:
            raise ValueError("truncated dependency")
        r.deps_at[k] = at
        if _u32(p + at + 1) >= nstr:
            raise ValueError("string index out of range")
        if p[at] == 0x63:     # 'c': args, instance key, hash
            at = _blob(p, at + 5, end)
            at = _blob(p, at, end)
            at = _blob(p, at, end)
        elif p[at] == 0x69:   # 'i': hash
            at = _blob(p, at + 5, end)
        else:
            raise ValueError("unknown dependency kind")
    r.ndeps = ndeps
    if at != end:
        raise ValueError("trailing bytes after the record")
    return r


# --- writing: sizes first, then one buffer filled in place (no per-field bytes objects) ----

cdef inline unsigned char *_w32(unsigned char *p, Py_ssize_t v) noexcept nogil:
    p[0] = (v >> 24) & 0xff
    p[1] = (v >> 16) & 0xff
    p[2] = (v >> 8) & 0xff
    p[3] = v & 0xff
    return p + 4


cdef inline unsigned char *_w64(unsigned char *p, uint64_t v) noexcept nogil:
    cdef int i
    for i in range(8):
        p[i] = (v >> (56 - 8 * i)) & 0xff
    return p + 8


cdef inline unsigned char *_wblob(unsigned char *p, const char *s, Py_ssize_t n) noexcept nogil:
    p = _w32(p, n)
    memcpy(p, s, n)
    return p + n


cdef inline unsigned char *_wbytes(unsigned char *p, bytes b) noexcept:
    # a blob holding b
    return _wblob(p, PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b))


cdef inline Py_ssize_t _sid(list strs, str s) except -1:
    # the index of s in the record's string table (appended if new)
    cdef Py_ssize_t i
    for i in range(len(strs)):
        if <str>strs[i] == s:
            return i
    strs.append(s)
    return len(strs) - 1


cdef bytes _pack_record(str ident, str label, bytes args, bytes val, bytes vh, list deps,
                        long long run):
    # deps: ("i", name, hash) or ("c", identity, args, instance key, hash)
    cdef list strs = []
    cdef Py_ssize_t cell_i = _sid(strs, ident)
    cdef Py_ssize_t label_i = _sid(strs, label)
    cdef Py_ssize_t nd = len(deps), k, n, size, sl
    cdef Py_ssize_t *sids = <Py_ssize_t *>malloc((nd if nd else 1) * sizeof(Py_ssize_t))
    cdef const char *sp
    cdef tuple d
    cdef unsigned char *out
    cdef unsigned char *w
    if sids == NULL:
        raise MemoryError()
    try:
        size = 12 + 8 + 12 + len(args) + len(val) + len(vh) + 4
        for k in range(nd):
            d = <tuple>deps[k]
            sids[k] = _sid(strs, <str>d[1])
            if <str>d[0] == "i":
                size += 9 + len(<bytes>d[2])
            else:
                size += 17 + len(<bytes>d[2]) + len(<bytes>d[3]) + len(<bytes>d[4])
        for s in strs:
            PyUnicode_AsUTF8AndSize(s, &sl)      # (UnicodeEncodeError for a lone surrogate)
            size += 4 + sl
        if size > REC_MAX:
            raise ValueError("record too large")
        res = PyBytes_FromStringAndSize(NULL, HEAD + size)
        out = <unsigned char *>PyBytes_AS_STRING(res)
        w = out + HEAD
        w = _w64(w, <uint64_t>run)
        w = _w32(w, len(strs))
        for s in strs:
            sp = PyUnicode_AsUTF8AndSize(s, &sl)
            w = _wblob(w, sp, sl)
        w = _w32(w, cell_i)
        w = _w32(w, label_i)
        w = _wbytes(w, args)
        w = _wbytes(w, val)
        w = _wbytes(w, vh)
        w = _w32(w, nd)
        for k in range(nd):
            d = <tuple>deps[k]
            if <str>d[0] == "i":
                w[0] = 0x69
                w = _w32(w + 1, sids[k])
                w = _wbytes(w, <bytes>d[2])
            else:
                w[0] = 0x63
                w = _w32(w + 1, sids[k])
                w = _wbytes(w, <bytes>d[2])
                w = _wbytes(w, <bytes>d[3])
                w = _wbytes(w, <bytes>d[4])
        out[0] = 0x69
        out[1] = 0x52
        out[2] = REC_FORMAT
        out[3] = REC_KIND
        _w32(out + 4, size)
        _w64(out + 8, _xxh64(out + HEAD, size))
        return res
    finally:
        free(sids)


# --- the index (layout in incr/store.py) -----------------------------------------------------

cdef bytes _INDEX_ROOT = bytes(16)


cdef bytes _index_step(bytes node, bytes kind, bytes ref, bytes h):
    # the index node after `node` once the dependency `ref` (an input's UTF-8 name, or a
    # cell's instance key) read a value of hash h: XXH3-128(node | kind | len | ref | len | h)
    cdef Py_ssize_t n = len(node) + len(kind) + 8 + len(ref) + len(h)
    pre = PyBytes_FromStringAndSize(NULL, n)
    cdef unsigned char *w = <unsigned char *>PyBytes_AS_STRING(pre)
    memcpy(w, PyBytes_AS_STRING(node), len(node))
    w += len(node)
    memcpy(w, PyBytes_AS_STRING(kind), len(kind))
    w += len(kind)
    w = _wbytes(w, ref)
    _wbytes(w, h)
    return _xxh3_128_digest(pre)


cdef inline bytes _cat_blobs(bytes head, bytes a, bytes b, bytes c):
    # head + blob(a) [+ blob(b) + blob(c)]: one index item
    cdef Py_ssize_t n = len(head) + 4 + len(a)
    if b is not None:
        n += 8 + len(b) + len(c)
    res = PyBytes_FromStringAndSize(NULL, n)
    cdef unsigned char *w = <unsigned char *>PyBytes_AS_STRING(res)
    memcpy(w, PyBytes_AS_STRING(head), len(head))
    w = _wbytes(w + len(head), a)
    if b is not None:
        w = _wbytes(w, b)
        _wbytes(w, c)
    return res


cdef list _index_nodes(bytes ikey, bytes entry, list deps):
    # the index nodes, (key, value), that lead from ikey's root to `entry` through deps,
    # given as _pack_record takes them: ("i", name, hash) or ("c", identity, args, ikey, hash)
    cdef bytes node = _INDEX_ROOT
    cdef list out = []
    cdef tuple d
    for d in deps:
        if <str>d[0] == "i":
            name = (<str>d[1]).encode("utf-8")
            out.append((ikey + node, _cat_blobs(b"i", name, None, None)))
            node = _index_step(node, b"i", name, d[2])
        else:
            out.append((ikey + node, _cat_blobs(b"c", (<str>d[1]).encode("utf-8"), d[2], d[3])))
            node = _index_step(node, b"c", d[3], d[4])
    out.append((ikey + node, _cat_blobs(b"E", entry, None, None)))
    return out


def index_nodes(bytes ikey, bytes entry, list deps):
    """The index nodes (key, value) of one entry, deps as ``unpack_record`` gives them (for
    incr.store: rebuilding the index; tests)."""
    conv = []
    for kind, ref, h in deps:
        conv.append(("i", ref, h) if kind == "i" else ("c", ref[0], ref[1], ref[2], h))
    return _index_nodes(ikey, entry, conv)


def read_record(data, key=b""):
    """Check one stored record; the Record, or ValueError (only) if it is not sound."""
    return _read_record(key, data)


def pack_record_fields(str ident, str label, bytes args, bytes val, bytes vh, list deps,
                       long long run):
    """The stored bytes of one record (see incr/store.py for the layout)."""
    return _pack_record(ident, label, args, val, vh, deps, run)


# --- the common encodings, decoded without the general decoder ------------------------------
#
# keys.decode is the codec; this reads the encodings that make up most arguments and values
# (None, bool, int, float, str, bytes, and a tuple of those) straight from the record buffer
# and gives _NOT_SIMPLE for anything else, which then goes to keys.decode. For bytes it
# accepts, it returns what keys.decode returns (tests/test_store_damage.py checks this).

cdef object _NOT_SIMPLE = object()
NOT_SIMPLE = _NOT_SIMPLE   # for the engine (a Python attribute: cdef globals are not shared)


cdef object _simple_item(const unsigned char *p, Py_ssize_t end, Py_ssize_t *pos):
    cdef Py_ssize_t i = pos[0]
    cdef Py_ssize_t n, start
    cdef unsigned char b
    if i >= end:
        return _NOT_SIMPLE
    b = p[i]
    if b <= 0x7f:
        pos[0] = i + 1
        return <long>b
    if b >= 0xe0:
        pos[0] = i + 1
        return <long>(<signed char>b)
    if b == 0xc0:
        pos[0] = i + 1
        return None
    if b == 0xc2:
        pos[0] = i + 1
        return False
    if b == 0xc3:
        pos[0] = i + 1
        return True
    if 0xa0 <= b <= 0xbf or 0xd9 <= b <= 0xdb or 0xc4 <= b <= 0xc6:
        if 0xa0 <= b <= 0xbf:
            n, start = b & 0x1f, i + 1
        elif b == 0xd9 or b == 0xc4:
            if i + 2 > end:
                return _NOT_SIMPLE
            n, start = p[i + 1], i + 2
        elif b == 0xda or b == 0xc5:
            if i + 3 > end:
                return _NOT_SIMPLE
            n, start = (p[i + 1] << 8) | p[i + 2], i + 3
        else:
            if i + 5 > end:
                return _NOT_SIMPLE
            n, start = _u32(p + i + 1), i + 5
        if n > end - start:
            return _NOT_SIMPLE
        pos[0] = start + n
        if b >= 0xc4 and b <= 0xc6:
            return PyBytes_FromStringAndSize(<const char *>p + start, n)
        try:
            return PyUnicode_DecodeUTF8(<const char *>p + start, n, "strict")
        except UnicodeDecodeError:
            return _NOT_SIMPLE
    if 0xca <= b <= 0xd3:
        if b == 0xca:
            n = 4
        elif b == 0xcb:
            n = 8
        elif b == 0xcc or b == 0xd0:
            n = 1
        elif b == 0xcd or b == 0xd1:
            n = 2
        elif b == 0xce or b == 0xd2:
            n = 4
        else:
            n = 8
        if i + 1 + n > end:
            return _NOT_SIMPLE
        pos[0] = i + 1 + n
        p = p + i + 1
        if b == 0xca:
            return PyFloat_Unpack4(<const char *>p, 0)
        if b == 0xcb:
            return PyFloat_Unpack8(<const char *>p, 0)
        if b == 0xcc:
            return <long>p[0]
        if b == 0xcd:
            return <long>((p[0] << 8) | p[1])
        if b == 0xce:
            return <long long>_u32(p)
        if b == 0xcf:
            return _u64(p)
        if b == 0xd0:
            return <long>(<int8_t>p[0])
        if b == 0xd1:
            return <long>(<int16_t>((p[0] << 8) | p[1]))
        if b == 0xd2:
            return <long>(<int32_t><uint64_t>_u32(p))
        return <long long>(<int64_t>_u64(p))
    return _NOT_SIMPLE


cdef object _decode_at(bytes data, Py_ssize_t at, Py_ssize_t n):
    # the value encoded by data[at:at + n]: the simple cases here, the rest by keys.decode.
    # Raises keys.DecodeError (only) on bad bytes.
    v = _decode_simple(data, at, n)
    if v is _NOT_SIMPLE:
        return _keys.decode(data[at:at + n])
    return v


cdef object _decode_simple(bytes data, Py_ssize_t at, Py_ssize_t n):
    # the value encoded by data[at:at + n] when it is one of the common encodings, else
    # _NOT_SIMPLE
    cdef const unsigned char *p = <const unsigned char *>PyBytes_AS_STRING(data)
    cdef Py_ssize_t end = at + n
    cdef Py_ssize_t pos = at
    cdef Py_ssize_t ext_n, count, k
    cdef unsigned char b
    cdef tuple t
    v = _NOT_SIMPLE
    if n > 0:
        b = p[at]
        if b == 0xd4 or b == 0xd5 or b == 0xd6 or b == 0xd7 or b == 0xd8 or b == 0xc7 \
                or b == 0xc8 or b == 0xc9:
            # an extension: simple only if a tuple of simple items filling it exactly
            if b <= 0xc9:
                if b == 0xc7 and n >= 2:
                    ext_n, pos = p[at + 1], at + 2
                elif b == 0xc8 and n >= 3:
                    ext_n, pos = (p[at + 1] << 8) | p[at + 2], at + 3
                elif b == 0xc9 and n >= 5:
                    ext_n, pos = _u32(p + at + 1), at + 5
                else:
                    ext_n, pos = -1, end
            else:
                ext_n, pos = (1 << (b - 0xd4)), at + 1
            if ext_n >= 0 and pos < end and p[pos] == 1 and end - pos - 1 == ext_n:
                pos += 1
                b = p[pos]
                count = -1
                if 0x90 <= b <= 0x9f:
                    count, pos = b & 0x0f, pos + 1
                elif b == 0xdc and pos + 3 <= end:
                    count, pos = (p[pos + 1] << 8) | p[pos + 2], pos + 3
                elif b == 0xdd and pos + 5 <= end:
                    count, pos = _u32(p + pos + 1), pos + 5
                if 0 <= count <= end - pos:
                    t = PyTuple_New(count)
                    for k in range(count):
                        x = _simple_item(p, end, &pos)
                        if x is _NOT_SIMPLE:
                            break
                        Py_INCREF(x)
                        PyTuple_SET_ITEM(t, k, x)
                    else:
                        if pos == end:
                            v = t
        else:
            v = _simple_item(p, end, &pos)
            if v is not _NOT_SIMPLE and pos != end:
                v = _NOT_SIMPLE
    return v


def decode_simple(bytes data):
    """(True, value) when the fast reader takes ``data`` (then keys.decode gives the same
    value), else (False, None). For tests."""
    v = _decode_simple(data, 0, len(data))
    if v is _NOT_SIMPLE:
        return False, None
    return True, v


def _minus_run(Record r):
    return -r.run


cdef void _add_usage_tag(bytearray tags, bytes key) except *:
    # append store.usage_tag(key) (bytes 1-4 and the last 4 of the entry key) to tags
    cdef Py_ssize_t n = len(tags)
    cdef const char *k = PyBytes_AS_STRING(key)
    cdef Py_ssize_t m = len(key)
    cdef char *t
    if m < 9:
        raise ValueError("an entry key is longer than 8 bytes")
    PyByteArray_Resize(tags, n + 8)
    t = PyByteArray_AS_STRING(tags) + n
    memcpy(t, k + 1, 4)
    memcpy(t + 4, k + m - 4, 4)


def add_usage_tag(bytearray tags, bytes key):
    """What adopt does for each hit (for tests: must equal store.usage_tag)."""
    _add_usage_tag(tags, key)


cdef dict _ikey_prefix = _keys._ikey_prefix
from xxhash import xxh3_128_digest as _xxh3_128_digest


cdef bytes _instance_key(str ident, bytes args, str algorithm):
    # keys.instance_key, without a Python call when its pre-image prefix is known (xxh3_128)
    cdef object pre
    if algorithm == "xxh3_128":
        pre = _ikey_prefix.get(ident)
        if pre is not None:
            return b"x" + _xxh3_128_digest(<bytes>pre + args)
    return _keys.instance_key(ident, args, algorithm)


def instance_key(str ident, bytes args, str algorithm):
    """What the runtime uses as keys.instance_key (for tests: they must agree)."""
    return _instance_key(ident, args, algorithm)




# --- the common encodings, written without the general encoder -----------------------------
#
# keys.encode / keys.encode_value of None, bool, int (64-bit), float (not NaN), str, bytes, and
# a tuple of those are msgpack's bytes (use_bin_type, strict types; a tuple as extension 1
# around an array): written here byte for byte, so an instance key or value hash made here
# equals keys' (tests/test_store_codec.py checks it). Anything else is None: keys decides.

cdef inline Py_ssize_t _simple_size(object v) except -2:
    # bytes msgpack writes for v, or -1 if v is not one of the simple kinds
    cdef type t = type(v)
    cdef int ovf
    cdef long long x
    cdef Py_ssize_t n
    cdef double f
    if v is None or t is bool:
        return 1
    if t is int:
        x = PyLong_AsLongLongAndOverflow(v, &ovf)
        if ovf:
            return -1
        if -32 <= x < 128:
            return 1
        if -128 <= x < 256:
            return 2
        if -32768 <= x < 65536:
            return 3
        if -2147483648 <= x < 4294967296:
            return 5
        return 9
    if t is float:
        f = v
        return 9 if f == f else -1
    if t is str:
        try:
            PyUnicode_AsUTF8AndSize(v, &n)
        except UnicodeError:
            return -1
        return n + (1 if n < 32 else 2 if n < 256 else 3 if n < 65536 else 5)
    if t is bytes:
        n = PyBytes_GET_SIZE(v)
        return n + (2 if n < 256 else 3 if n < 65536 else 5)
    return -1


cdef inline unsigned char *_simple_write(unsigned char *w, object v) except NULL:
    # (v passed _simple_size)
    cdef type t = type(v)
    cdef int ovf
    cdef long long x
    cdef Py_ssize_t n
    cdef const char *s
    if v is None:
        w[0] = 0xc0
        return w + 1
    if t is bool:
        w[0] = 0xc3 if v is True else 0xc2
        return w + 1
    if t is int:
        x = PyLong_AsLongLongAndOverflow(v, &ovf)
        if 0 <= x < 128:
            w[0] = <unsigned char>x
            return w + 1
        if -32 <= x < 0:
            w[0] = <unsigned char>(x & 0xff)
            return w + 1
        if x >= 0:
            if x < 256:
                w[0] = 0xcc
                w[1] = <unsigned char>x
                return w + 2
            if x < 65536:
                w[0] = 0xcd
                w[1] = (x >> 8) & 0xff
                w[2] = x & 0xff
                return w + 3
            if x < 4294967296:
                w[0] = 0xce
                return _w32(w + 1, <Py_ssize_t>x)
            w[0] = 0xcf
            return _w64(w + 1, <uint64_t>x)
        if x >= -128:
            w[0] = 0xd0
            w[1] = <unsigned char>(x & 0xff)
            return w + 2
        if x >= -32768:
            w[0] = 0xd1
            w[1] = (x >> 8) & 0xff
            w[2] = x & 0xff
            return w + 3
        if x >= -2147483648:
            w[0] = 0xd2
            return _w32(w + 1, <Py_ssize_t>(x & 0xffffffff))
        w[0] = 0xd3
        return _w64(w + 1, <uint64_t>x)
    if t is float:
        w[0] = 0xcb
        PyFloat_Pack8(<double>v, <char *>w + 1, 0)
        return w + 9
    if t is str:
        s = PyUnicode_AsUTF8AndSize(v, &n)
        if n < 32:
            w[0] = 0xa0 | n
            w += 1
        elif n < 256:
            w[0] = 0xd9
            w[1] = <unsigned char>n
            w += 2
        elif n < 65536:
            w[0] = 0xda
            w[1] = (n >> 8) & 0xff
            w[2] = n & 0xff
            w += 3
        else:
            w[0] = 0xdb
            w = _w32(w + 1, n)
        memcpy(w, s, n)
        return w + n
    n = PyBytes_GET_SIZE(v)
    if n < 256:
        w[0] = 0xc4
        w[1] = <unsigned char>n
        w += 2
    elif n < 65536:
        w[0] = 0xc5
        w[1] = (n >> 8) & 0xff
        w[2] = n & 0xff
        w += 3
    else:
        w[0] = 0xc6
        w = _w32(w + 1, n)
    memcpy(w, PyBytes_AS_STRING(v), n)
    return w + n


cdef inline Py_ssize_t _array_head(Py_ssize_t n) noexcept nogil:
    return 1 if n < 16 else 3 if n < 65536 else 5


cdef inline unsigned char *_array_write(unsigned char *w, Py_ssize_t n) noexcept nogil:
    if n < 16:
        w[0] = 0x90 | n
        return w + 1
    if n < 65536:
        w[0] = 0xdc
        w[1] = (n >> 8) & 0xff
        w[2] = n & 0xff
        return w + 3
    w[0] = 0xdd
    return _w32(w + 1, n)


cdef bytes _encode_simple(object v):
    # keys.encode(v) (= keys.encode_value(v)) when v is a simple value or a tuple of them,
    # else None
    cdef Py_ssize_t n, k, inner, m, head
    cdef unsigned char *w
    cdef tuple t
    if type(v) is not tuple:
        n = _simple_size(v)
        if n < 0:
            return None
        res = PyBytes_FromStringAndSize(NULL, n)
        _simple_write(<unsigned char *>PyBytes_AS_STRING(res), v)
        return res
    t = <tuple>v
    m = len(t)
    inner = _array_head(m)
    for k in range(m):
        n = _simple_size(t[k])
        if n < 0:
            return None
        inner += n
    # the extension's head: fixext 1/2/4/8/16, else ext 8/16/32
    if inner == 1 or inner == 2 or inner == 4 or inner == 8 or inner == 16:
        head = 2
    elif inner < 256:
        head = 3
    elif inner < 65536:
        head = 4
    else:
        head = 6
    res = PyBytes_FromStringAndSize(NULL, head + inner)
    w = <unsigned char *>PyBytes_AS_STRING(res)
    if head == 2:
        w[0] = 0xd4 if inner == 1 else 0xd5 if inner == 2 else 0xd6 if inner == 4 \
            else 0xd7 if inner == 8 else 0xd8
        w += 1
    elif head == 3:
        w[0] = 0xc7
        w[1] = <unsigned char>inner
        w += 2
    elif head == 4:
        w[0] = 0xc8
        w[1] = (inner >> 8) & 0xff
        w[2] = inner & 0xff
        w += 3
    else:
        w[0] = 0xc9
        w = _w32(w + 1, inner)
    w[0] = 1              # keys.EXT_TUPLE
    w = _array_write(w + 1, m)
    for k in range(m):
        w = _simple_write(w, t[k])
    return res


def encode_simple(v):
    """What the engine writes for keys.encode(v) without calling it, or None (for tests)."""
    return _encode_simple(v)


cdef int KEYS_FORMAT = _keys.FORMAT


cdef bytes _digest(str domain, bytes tag, bytes payload, str algorithm):
    # keys.digest(domain, payload, algorithm); tag is keys.DOMAINS[domain]
    cdef Py_ssize_t n
    cdef unsigned char *w
    if algorithm != "xxh3_128":
        return _keys.digest(domain, payload, algorithm)
    n = len(payload)
    pre = PyBytes_FromStringAndSize(NULL, 6 + n)
    w = <unsigned char *>PyBytes_AS_STRING(pre)
    memcpy(w, b"incr", 4)
    w[4] = KEYS_FORMAT
    w[5] = (<const unsigned char *>PyBytes_AS_STRING(tag))[0]
    memcpy(w + 6, PyBytes_AS_STRING(payload), n)
    return b"x" + _xxh3_128_digest(pre)


def digest(str domain, bytes payload, str algorithm):
    """keys.digest, as the engine computes it (for tests: they must agree)."""
    return _digest(domain, _keys.DOMAINS[domain], payload, algorithm)


cdef bytes _trace_bytes(list stored):
    # msgpack.packb([["i", name, hash] | ["c", [identity, args], hash], ...],
    # use_bin_type=True) for stored = [("i", name, hash) | ("c", identity, args, ikey, hash)]:
    # the pre-image of an entry's trace hash, written in place; None if a name is not
    # UTF-8 (msgpack then says why)
    cdef Py_ssize_t size = _array_head(len(stored)), a, b, c
    cdef tuple d
    cdef unsigned char *w
    for d in stored:
        a = _simple_size(d[1])
        b = _simple_size(d[2])
        if <str>d[0] == "i":
            c = 0
        else:
            c = _simple_size(d[4]) + 1
        if a < 0 or b < 0 or c < 0:
            return None
        size += 3 + a + b + c
    res = PyBytes_FromStringAndSize(NULL, size)
    w = <unsigned char *>PyBytes_AS_STRING(res)
    w = _array_write(w, len(stored))
    for d in stored:
        w[0] = 0x93
        w[1] = 0xa1
        if <str>d[0] == "i":
            w[2] = 0x69
            w = _simple_write(w + 3, d[1])
            w = _simple_write(w, d[2])
        else:
            w[2] = 0x63
            w[3] = 0x92
            w = _simple_write(w + 4, d[1])
            w = _simple_write(w, d[2])
            w = _simple_write(w, d[4])
    return res


def trace_bytes(list stored):
    """The trace hash's pre-image as the engine writes it (for tests: must equal msgpack's)."""
    return _trace_bytes(stored)
