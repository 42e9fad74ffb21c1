"""Canonical forms of cell arguments (internal; the one place that knows how keys are made).

``normalize_args(label, names, args)`` turns arguments into a hashable, type-tagged form so that
two calls give the same instance exactly when they are the same value of the same type: ``1``, ``1.0`` and
``True`` are three instances, ``(1,)`` and ``[1]`` are two, ``0.0`` and ``-0.0`` are two, and every
NaN is the same argument. Anything that is not in the contract's list of encodable types, or
registered with :func:`register_type`, raises :class:`TypeError`.

Invariant: the forms of ``a`` and ``b`` are equal iff ``a`` and ``b`` are equal values of the same types,
all the way down.
"""

from __future__ import annotations

from typing import Any, Callable

_registry: dict[type, tuple[str, Callable[[Any], Any], Callable[[Any], Any]]] = {}


def register_type(cls: type, encode: Callable[[Any], Any], decode: Callable[[Any], Any]) -> None:
    """Allow instances of ``cls`` as cell arguments.

    ``encode(obj)`` must return an encodable value (None, bool, int, float, str, bytes, tuple,
    list, dict with str keys, frozenset or another registered type) and ``decode`` must invert it.
    Registering the same class again replaces its codec.

    >>> import datetime, incr
    >>> incr.register_type(datetime.date, lambda d: d.isoformat(), datetime.date.fromisoformat)

    Raises ``TypeError`` if ``cls`` is not a class or a codec is not callable, and ``ValueError``
    for a built-in type that already has a canonical form.
    """
    if not isinstance(cls, type):
        raise TypeError(f"register_type: cls must be a class, got {cls!r}")
    if not callable(encode) or not callable(decode):
        raise TypeError(f"register_type({cls.__qualname__}): encode and decode must be callable")
    if cls in _BUILTIN:
        raise ValueError(f"register_type: {cls.__name__} already has a canonical form")
    import inspect
    for what, f in (("encode", encode), ("decode", decode)):
        if inspect.iscoroutinefunction(f) or inspect.iscoroutinefunction(
                getattr(type(f), "__call__", None)):
            raise TypeError(f"register_type({cls.__qualname__}): {what} "
                            f"{getattr(f, '__qualname__', f)!r} is an async function; it must be "
                            f"a plain def (a coroutine is never an encoding)")
    _registry[cls] = (f"{cls.__module__}.{cls.__qualname__}", encode, decode)


def _a(name: str) -> str:
    """``name`` with its article: "a lock", "an object"."""
    return ("an " if name[:1].lower() in "aeiou" else "a ") + name


class _Unencodable(Exception):
    def __init__(self, path: str, value: Any):
        self.path = path
        self.value = value


def _float_key(v: float) -> str:
    # repr-free and exact: distinguishes 0.0 from -0.0, and makes every NaN the same argument
    return "nan" if v != v else v.hex()


class _TooDeep(Exception):
    def __init__(self, path: str):
        self.path = path


def _norm(v: Any, path: str, depth: int = 0) -> Any:
    t = type(v)
    if t is str or t is int or v is None:
        return v  # safe raw: bool and float are tagged, so 1, True and 1.0 stay apart
    if depth > MAX_DEPTH:
        raise _TooDeep(path)
    if t is bool:
        return ("b", v)
    if t is float:
        return ("f", _float_key(v))
    if t is bytes:
        return ("y", v)
    if t is tuple:
        return ("t", tuple(_norm(x, f"{path}[{i}]", depth + 1) for i, x in enumerate(v)))
    if t is list:
        return ("l", tuple(_norm(x, f"{path}[{i}]", depth + 1) for i, x in enumerate(v)))
    if t is dict:
        items = []
        for k, x in v.items():
            if type(k) is not str:
                raise _Unencodable(f"{path} key {k!r}", k)
            items.append((k, _norm(x, f"{path}[{k!r}]", depth + 1)))
        items.sort(key=lambda kv: kv[0])
        return ("d", tuple(items))
    if t is frozenset:
        return ("s", frozenset(_norm(x, f"{path}{{}}", depth + 1) for x in v))
    spec = _registry.get(t)
    if spec is not None:
        return ("r", spec[0], _norm(spec[1](v), f"{path}<{t.__qualname__}>", depth + 1))
    inputname = getattr(v, "_incr_input_name", None)
    if inputname is not None:
        return ("I", inputname)
    raise _Unencodable(path, v)


def normalize_args(label: str, names: tuple[str, ...], args: tuple) -> tuple:
    """Canonical form of a cell's bound positional arguments, for the cell labelled ``label``."""
    out = []
    for i, a in enumerate(args):
        t = type(a)
        if t is str or t is int or a is None:
            out.append(a)
        else:
            name = names[i] if i < len(names) else f"argument {i}"
            try:
                out.append(_norm(a, name))
            except _Unencodable as e:
                raise TypeError(f"{label}: {_message(name, e)}") from None
            except (_TooDeep, RecursionError):
                raise TypeError(f"{label}: argument {name} is nested deeper than {MAX_DEPTH} "
                                f"levels, which incr does not key on; pass a flatter value, or "
                                f"call incr.register_type() for a type that encodes it") from None
    return tuple(out)


def _message(what: str, e: _Unencodable) -> str:
    return (
        f"argument {e.path!s} is {_a(type(e.value).__qualname__)}, which incr cannot use as a key "
        f"(got {_short(e.value)}); pass None, bool, int, float, str, bytes, tuple, list, "
        f"dict with str keys, frozenset or an Input, or call incr.register_type() for it"
    )


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


_BUILTIN = {type(None), bool, int, float, str, bytes, tuple, list, dict, frozenset}


# --- canonical bytes and content hashes (persistent keys) -----------------------------------
#
# The canonical encoding is msgpack (use_bin_type=True, strict_types=True) of the value with:
# dict keys sorted (str keys only), tuple and frozenset and registered types and Inputs as
# extension types (so tuple != list), floats always as float64 with one NaN bit pattern (-0.0
# stays distinct from 0.0, as in normalize), bool/int/float kept apart by msgpack itself.
# decode() accepts only these extension codes and str map keys; anything else is an error.

import struct as _struct

import msgpack as _msgpack
import xxhash as _xxhash
import hashlib as _hashlib

FORMAT = 2                      # bump when the encoding or a pre-image layout changes
                                # (2: values keep dict order, so their hashes changed)
EXT_TUPLE = 1
EXT_FROZENSET = 2
EXT_REGISTERED = 3
EXT_INPUT = 4
_NAN = _struct.unpack(">d", bytes.fromhex("7ff8000000000000"))[0]

DOMAINS = {"input": b"I", "cell": b"C", "value": b"V", "llm": b"L", "validator": b"A",
           "trace": b"T", "langgraph": b"G", "prefect": b"P"}


import threading as _threading

_local = _threading.local()          # one reusable Packer per thread (a Packer is not reentrant)


def _simple_packer() -> Any:
    p = getattr(_local, "packer", None)
    if p is None:
        p = _local.packer = _msgpack.Packer(use_bin_type=True, strict_types=True,
                                             use_single_float=False, autoreset=True)
    return p


_SIMPLE_SET = frozenset((int, str, bytes, type(None), bool))


class DecodeError(ValueError):
    """Bytes that are not a canonical encoding this version of incr can read."""


def _default(v: Any, ordered: bool = False) -> Any:
    t = type(v)
    if t is tuple:
        return _msgpack.ExtType(EXT_TUPLE, _pack(list(v), ordered))
    if t is frozenset:
        parts = sorted(_pack(x, ordered) for x in v)
        return _msgpack.ExtType(EXT_FROZENSET, b"".join(_frame(p) for p in parts))
    spec = _registry.get(t)
    if spec is not None:
        return _msgpack.ExtType(EXT_REGISTERED, _pack([spec[0], spec[1](v)], ordered))
    name = getattr(v, "_incr_input_name", None)
    if name is not None:
        return _msgpack.ExtType(EXT_INPUT, name.encode())
    raise _Unencodable("value", v)


def _default_ordered(v: Any) -> Any:
    return _default(v, True)


def _frame(b: bytes) -> bytes:
    return len(b).to_bytes(4, "big") + b


MAX_DEPTH = 64      # nesting beyond this is not encoded (TypeError) nor decoded (DecodeError):
                    # the C encoder and decoder recurse, and a deep value must not crash them


def _prepare(v: Any, depth: int = 0, ordered: bool = False) -> Any:
    # canonicalize floats and (for keys) sort dict keys; containers are rebuilt (same types).
    # ``ordered``: keep dict keys in their order (values round-trip exactly, order included)
    t = type(v)
    if t is dict or t is list or t is tuple or t is frozenset:
        if depth >= MAX_DEPTH:
            raise _Unencodable(f"value nested deeper than {MAX_DEPTH} levels", v)
        if t is dict:
            for k in v:
                if type(k) is not str:
                    raise _Unencodable(f"key {k!r}", k)
            return {k: _prepare(v[k], depth + 1, ordered) for k in (v if ordered else sorted(v))}
        if t is list:
            return [_prepare(x, depth + 1, ordered) for x in v]
        if t is tuple:
            return tuple(_prepare(x, depth + 1, ordered) for x in v)
        return frozenset(_prepare(x, depth + 1, ordered) for x in v)
    if t is float and v != v:
        return _NAN
    return v


def _pack(v: Any, ordered: bool = False) -> bytes:
    t = type(v)
    if t in _SIMPLE_SET or (t is float and v == v):
        return _simple_packer().pack(v)
    if t is tuple:
        for x in v:
            tx = type(x)
            if tx not in _SIMPLE_SET and not (tx is float and x == x):
                break
        else:  # the common argument tuple: no normalization needed, one ext wrapper
            return _ext_bytes(EXT_TUPLE, _simple_packer().pack(list(v)))
    # the general path may recurse through _default: a fresh packer each time
    return _msgpack.packb(_prepare(v, 0, ordered), use_bin_type=True, strict_types=True,
                          default=_default_ordered if ordered else _default,
                          use_single_float=False)


_FIXEXT = {1: b"\xd4", 2: b"\xd5", 4: b"\xd6", 8: b"\xd7", 16: b"\xd8"}


def _ext_bytes(code: int, data: bytes) -> bytes:
    """msgpack's encoding of ExtType(code, data), byte for byte, without building one."""
    n = len(data)
    head = _FIXEXT.get(n)
    if head is None:
        if n < 256:
            head = b"\xc7" + bytes((n,))
        elif n < 65536:
            head = b"\xc8" + n.to_bytes(2, "big")
        else:
            head = b"\xc9" + n.to_bytes(4, "big")
    return head + bytes((code,)) + data


def instance_key(ident: str, args: bytes, algorithm: str) -> bytes:
    """The key of one instance: its cell's identity and its canonical arguments.

    Equal to ``digest("cell", len(ident) (u32) + ident + args, algorithm)``; the part of the
    pre-image before the arguments is kept per identity."""
    pre = _ikey_prefix.get(ident)
    if pre is None:
        b = ident.encode()
        pre = _ikey_prefix[ident] = (b"incr" + bytes((FORMAT,)) + DOMAINS["cell"]
                                     + len(b).to_bytes(4, "big") + b)
    if algorithm == "xxh3_128":
        return b"x" + _xxh3_128_digest(pre + args)
    if algorithm == "blake2b":
        return b"b" + _hashlib.blake2b(pre + args, digest_size=20).digest()
    raise ValueError(f"unknown hash algorithm {algorithm!r}; use 'xxh3_128' or 'blake2b'")


_ikey_prefix: dict[str, bytes] = {}
_xxh3_128_digest = _xxhash.xxh3_128_digest


def encode(value: Any, what: str = "value") -> bytes:
    """Canonical bytes of ``value``; ``TypeError`` naming ``what`` if it cannot be encoded.

    >>> encode((1, 2)) != encode([1, 2])
    True
    """
    try:
        return _pack(value)
    except _Unencodable as e:
        raise TypeError(_message(what, e)) from None
    except (OverflowError, ValueError) as e:  # ints beyond 64 bits, recursion
        raise TypeError(f"{what} cannot be encoded: {e}") from None


def encode_value(value: Any, what: str = "value") -> bytes:
    """The bytes a value is stored as, and hashed by: :func:`encode`, except that dict keys
    keep their order, so a value taken from the store is the value that was computed (a dict
    iterates in the same order). Argument keys sort dict keys (equal dicts are one instance);
    values do not (a reordered dict is a changed value). ``TypeError`` naming ``what`` if it
    cannot be encoded.

    >>> decode(encode_value({"zeta": 1, "alpha": 2}))
    {'zeta': 1, 'alpha': 2}
    """
    try:
        return _pack(value, True)
    except _Unencodable as e:
        raise TypeError(
            f"{what} holds {_a(type(e.value).__qualname__)}, which incr cannot store (got "
            f"{_short(e.value)}); return None, bool, int, float, str, bytes, tuple, list, dict "
            f"with str keys or frozenset, or call incr.register_type() for it") from None
    except (OverflowError, ValueError) as e:
        raise TypeError(f"{what} cannot be encoded: {e}") from None


def own_args(args: tuple) -> tuple | None:
    """A deep copy of a call's bound arguments that shares nothing mutable with them, or None
    when they hold nothing mutable (str, int, float, bool, bytes, None, frozenset, Input and
    tuples of those need no copy). An instance keeps this copy, and each run of its function
    gets a fresh one (``own_args`` of the kept copy), so mutating an argument after the call,
    or inside the cell, never changes what the instance computes. Registered types are copied
    through their codec: ``decode(copy of encode(obj))``."""
    if not any(_mutable(a) for a in args):
        return None
    return tuple(_copy(a, 0) for a in args)


_IMMUTABLE = frozenset((int, str, bytes, float, bool, type(None), frozenset))


def _mutable(v: Any) -> bool:
    t = type(v)
    if t in _IMMUTABLE:
        return False
    if t is tuple:
        return any(_mutable(x) for x in v)
    return getattr(v, "_incr_input_name", None) is None


def _copy(v: Any, depth: int) -> Any:
    t = type(v)
    if t in _IMMUTABLE:
        return v
    if depth > MAX_DEPTH + 8:
        raise TypeError(f"argument nested deeper than {MAX_DEPTH} levels")
    if t is list:
        return [_copy(x, depth + 1) for x in v]
    if t is dict:
        return {k: _copy(x, depth + 1) for k, x in v.items()}
    if t is tuple:
        return tuple(_copy(x, depth + 1) for x in v)
    spec = _registry.get(t)
    if spec is not None:
        return spec[2](_copy(spec[1](v), depth + 1))
    return v   # an Input: it is a reference by design


def _ext_hook(code: int, data: bytes) -> Any:
    depth = getattr(_local, "depth", 0)
    if depth >= MAX_DEPTH:
        raise DecodeError(f"value nested deeper than {MAX_DEPTH} levels")
    _local.depth = depth + 1
    try:
        return _ext_value(code, data)
    finally:
        _local.depth = depth


def _ext_value(code: int, data: bytes) -> Any:
    if code == EXT_TUPLE:
        v = _unpack(data)
        if type(v) is not list:
            raise DecodeError("tuple extension does not hold an array")
        return tuple(v)
    if code == EXT_FROZENSET:
        out, i = [], 0
        while i < len(data):
            if i + 4 > len(data):
                raise DecodeError("truncated frozenset element")
            n = int.from_bytes(data[i:i + 4], "big")
            i += 4
            if i + n > len(data):
                raise DecodeError("truncated frozenset element")
            out.append(_unpack(data[i:i + n]))
            i += n
        try:
            return frozenset(out)
        except TypeError as e:
            raise DecodeError(f"unhashable frozenset element: {e}") from None
    if code == EXT_REGISTERED:
        v = _unpack(data)
        if type(v) is not list or len(v) != 2 or type(v[0]) is not str:
            raise DecodeError("malformed registered-type extension")
        for name, _enc, dec in list(_registry.values()):
            if name == v[0]:
                try:
                    return dec(v[1])
                except Exception as e:  # a user decoder refusing the payload
                    raise DecodeError(f"decoder of {name} failed: {e}") from None
        raise DecodeError(f"type {v[0]} is not registered in this process")
    if code == EXT_INPUT:
        return _InputRef(data.decode("utf-8", "strict"))
    raise DecodeError(f"extension type {code} is not allowed")


class _InputRef(str):
    """An Input argument, decoded: the input's name (resolved by the runtime)."""


def _str_keyed(pairs: list) -> dict:
    for k, _ in pairs:
        if type(k) is not str:
            raise DecodeError(f"map key {k!r} is not a str")
    return dict(pairs)


# msgpack decodes its timestamp extension (type -1, the byte 0xff) itself, without asking
# ext_hook; encode never produces one, so a value holding one is foreign.


def _no_timestamps(v: Any) -> None:
    stack = [v]
    while stack:
        x = stack.pop()
        t = type(x)
        if t is list or t is tuple or t is frozenset:
            stack.extend(x)
        elif t is dict:
            stack.extend(x.values())
        elif t is _msgpack.Timestamp:
            raise DecodeError("timestamp extension is not allowed")


def _unpack(data: bytes) -> Any:
    try:
        v = _msgpack.unpackb(data, raw=False, strict_map_key=True, ext_hook=_ext_hook,
                             use_list=True, object_pairs_hook=_str_keyed)
    except DecodeError:
        raise
    except Exception as e:  # msgpack's own errors: ExtraData, FormatError, StackError, ...
        raise DecodeError(f"{type(e).__name__}: {e}") from None
    if b"\xff" in data:  # only then can there be one: look for it
        _no_timestamps(v)
    return v


def decode(data: bytes) -> Any:
    """Invert :func:`encode`. Raises :class:`DecodeError` (and nothing else) on bad bytes."""
    if type(data) is not bytes:
        data = bytes(data)
    flat = _flat_tuple(data)
    if flat is not None:
        return flat
    return _unpack(data)


_FLAT_HEADS = {0xd4: 1, 0xd5: 2, 0xd6: 4, 0xd7: 8, 0xd8: 16}


def _flat_tuple(data: bytes) -> tuple | None:
    """The common argument tuple (an EXT_TUPLE of str, int, float, bytes, bool, None), decoded
    without hooks; None when ``data`` is anything else (the general decoder then decides)."""
    if len(data) < 3:
        return None
    head = data[0]
    n = _FLAT_HEADS.get(head)
    if n is not None:
        start = 1
    elif head == 0xc7:
        n, start = data[1], 2
    else:
        return None
    if data[start] != EXT_TUPLE or len(data) != start + 1 + n:
        return None
    inner = data[start + 1:]
    try:  # maps, extensions and timestamps decode to types refused below: no hooks needed
        v = _msgpack.unpackb(inner, raw=False, use_list=True)
    except Exception:
        return None
    if type(v) is not list:
        return None
    for x in v:
        if type(x) not in _FLAT_TYPES:
            return None
    return tuple(v)


_FLAT_TYPES = frozenset((int, str, bytes, float, bool, type(None)))


def digest(domain: str, payload: bytes, algorithm: str = "xxh3_128") -> bytes:
    """Content hash of ``payload`` in ``domain``: one algorithm byte, then the digest.

    Every pre-image starts with ``incr``, the format version and the domain tag, so hashes of
    different kinds of things never collide by construction.
    """
    pre = b"incr" + bytes((FORMAT,)) + DOMAINS[domain] + payload
    if algorithm == "xxh3_128":
        return b"x" + _xxhash.xxh3_128_digest(pre)
    if algorithm == "blake2b":
        return b"b" + _hashlib.blake2b(pre, digest_size=20).digest()
    raise ValueError(f"unknown hash algorithm {algorithm!r}; use 'xxh3_128' or 'blake2b'")


def checksum(payload: bytes) -> bytes:
    """XXH64 of a record payload, big endian (integrity, not authenticity). The record reader
    in incr._core computes the same in place."""
    return _xxhash.xxh64_digest(payload)


def code_fingerprint(fn: Any) -> bytes:
    """What stands for a function's identity when it has no ``version``: a hash of its code
    object — bytecode, constants (nested code objects included, recursively), names, variable
    names, and the defaults.

    It cannot see globals the function reads, functions it calls, or closure contents: editing
    a callee does not change the caller's fingerprint. Give such a cell ``version=`` and bump it.
    """
    code = getattr(fn, "__code__", None)
    h = _xxhash.xxh3_128()
    if code is None:
        h.update(repr(fn).encode())
        return h.digest()
    stack = [code]
    while stack:
        c = stack.pop()
        h.update(c.co_code)
        h.update(repr(c.co_names).encode())
        h.update(repr(c.co_varnames).encode())
        h.update(repr(c.co_freevars).encode())
        for k in c.co_consts:
            if hasattr(k, "co_code"):
                stack.append(k)
            else:
                h.update(repr((type(k).__name__, k)).encode())
    defaults = getattr(fn, "__defaults__", None)
    h.update(repr(defaults).encode())
    return h.digest()


# --- cell identity ---------------------------------------------------------------------------

import weakref as _weakref

_by_name: dict[str, list] = {}        # cell name -> weak references to the live cells so named
_index: dict[str, dict[str, list]] = {}   # cell name -> identity -> live cells (built lazily)


_resolved: dict[str, Any] = {}       # identity -> cell, cache of cell_for (cleared on register)


def register_cell(cell: Any) -> None:
    """Called for every new cell: lets ``cell_for`` find it by identity later. O(1)."""
    _by_name.setdefault(cell.name, []).append(_weakref.ref(cell))
    _index.pop(cell.name, None)
    if _resolved:
        _resolved.clear()
    if stored_cells:
        stored_cells.clear()


def _shallow(cell: Any) -> bytes:
    if getattr(cell, "is_llm", False):
        # an LLM node's function is the generic loop: its identity (generator, version,
        # validators and their versions) is set when it is made
        return b"l" + cell._incr_ident.encode()
    if cell.version is not None:
        return b"v" + repr(cell.version).encode()
    return b"c" + code_fingerprint(cell.fn)


def closure_fingerprint(fn: Any) -> tuple[bytes, bool]:
    """What the closure of ``fn`` holds, as far as it can be named: cells by name and code
    (not recursively), inputs by name, encodable values by their encoding, anything else by
    its type only. The flag says whether everything could be named (the fingerprint is exact)."""
    cells = getattr(fn, "__closure__", None) or ()
    h = _xxhash.xxh3_128()
    exact = True
    for c in cells:
        try:
            v = c.cell_contents
        except ValueError:  # an empty closure cell
            h.update(b"<empty>")
            continue
        if getattr(v, "_incr_is_cell", False):
            h.update(b"C" + v.name.encode() + _shallow(v))
            continue
        try:
            h.update(b"V" + _pack(v))
        except Exception:
            h.update(b"T" + f"{type(v).__module__}.{type(v).__qualname__}".encode())
            exact = False
    return h.digest(), exact


def _identity_of(cell: Any) -> str:
    ident = getattr(cell, "_incr_ident", None)
    if ident is None:
        if cell.version is not None:
            ident, exact = f"{cell.name}@v:{cell.version}", True
        else:
            cfp, exact = closure_fingerprint(cell.fn)
            fp = _xxhash.xxh3_64_hexdigest(_shallow(cell) + cfp)
            ident = f"{cell.name}@c:{fp}"
        cell._incr_ident = ident
        cell._incr_exact = exact
    return ident


def _name_index(name: str) -> dict[str, list]:
    idx = _index.get(name)
    if idx is None:
        idx = {}
        refs = []
        for r in _by_name.get(name, ()):
            c = r()  # dereference once: the collector may clear a weak reference at any time
            if c is not None:
                refs.append(r)
                idx.setdefault(_identity_of(c), []).append(r)
        _by_name[name] = refs
        _index[name] = idx
    return idx


def cell_identity(cell: Any) -> str | None:
    """The identity of a cell across processes, or None when it cannot be told apart from
    another live cell that may compute something else.

    ``module.qualname@v:<version>`` when the cell has a ``version``, else
    ``module.qualname@c:<hash of the code object and what its closure holds>``. Two live cells
    with the same identity share stored entries when the identity is exact (a version, or a
    closure whose every value could be named: re-running a notebook cell is this case); when
    part of a closure could be named only by its type, neither is stored (give them distinct
    ``version=``).
    """
    ident = _identity_of(cell)
    if cell._incr_exact:
        return ident
    live = [r for r in _name_index(cell.name).get(ident, ()) if r() is not None]
    return ident if len(live) <= 1 else None


def cell_for(ident: str) -> Any:
    """The live cell with identity ``ident`` (the newest, when the identity is exact), or None."""
    c = _resolved.get(ident)
    if c is None:
        c = _resolved[ident] = _cell_for(ident)
    return c


# identity -> the live cell whose stored identity is exactly ``identity`` (its entries are
# this identity's), or None; cleared in place on register (the runtime reads it directly)
stored_cells: dict[str, Any] = {}


def stored_cell(ident: str) -> Any:
    """The live cell that stores its entries under ``ident`` — ``cell_for(ident)``, provided
    ``cell_identity`` of it is ``ident`` — or None. Cached until the next cell is defined."""
    c = stored_cells.get(ident, stored_cells)
    if c is stored_cells:
        c = cell_for(ident)
        if c is not None and cell_identity(c) != ident:
            c = None
        stored_cells[ident] = c
    return c


def _cell_for(ident: str) -> Any:
    name = ident.rsplit("@", 1)[0]
    live = [r() for r in _name_index(name).get(ident, ())]
    live = [c for c in live if c is not None]
    if not live:
        return None
    if live[-1]._incr_exact or len(live) == 1:
        return live[-1]
    return None
