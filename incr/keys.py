"""Canonical forms of cell arguments (internal; the one place that knows how keys are made).

``normalize(value)`` turns an argument into a hashable, type-tagged form so that two arguments
give the same instance exactly when they are the same value of the same type: ``1``, ``1.0`` and
``True`` are three instances, ``(1,)`` and ``[1]`` are two, ``0.0`` and ``-0.0`` are two, and every
NaN is the same argument. Anything that is not in the contract's list of encodable types, or
registered with :func:`register_type`, raises :class:`TypeError`.

Invariant: ``normalize(a) == normalize(b)`` iff ``a`` and ``b`` are equal values of the same types,
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
    _registry[cls] = (f"{cls.__module__}.{cls.__qualname__}", encode, decode)


class _Unencodable(Exception):
    def __init__(self, path: str, value: Any):
        self.path = path
        self.value = value


def _float_key(v: float) -> str:
    # repr-free and exact: distinguishes 0.0 from -0.0, and makes every NaN the same argument
    return "nan" if v != v else v.hex()


def _norm(v: Any, path: str) -> Any:
    t = type(v)
    if t is str or t is int or v is None:
        return v  # safe raw: bool and float are tagged, so 1, True and 1.0 stay apart
    if t is bool:
        return ("b", v)
    if t is float:
        return ("f", _float_key(v))
    if t is bytes:
        return ("y", v)
    if t is tuple:
        return ("t", tuple(_norm(x, f"{path}[{i}]") for i, x in enumerate(v)))
    if t is list:
        return ("l", tuple(_norm(x, f"{path}[{i}]") for i, x in enumerate(v)))
    if t is dict:
        items = []
        for k, x in v.items():
            if type(k) is not str:
                raise _Unencodable(f"{path} key {k!r}", k)
            items.append((k, _norm(x, f"{path}[{k!r}]")))
        items.sort(key=lambda kv: kv[0])
        return ("d", tuple(items))
    if t is frozenset:
        return ("s", frozenset(_norm(x, f"{path}{{}}") for x in v))
    spec = _registry.get(t)
    if spec is not None:
        return ("r", spec[0], _norm(spec[1](v), f"{path}<{t.__qualname__}>"))
    inputname = getattr(v, "_incr_input_name", None)
    if inputname is not None:
        return ("I", inputname)
    raise _Unencodable(path, v)


def normalize(value: Any, what: str = "value") -> Any:
    """The canonical hashable form of ``value``; ``TypeError`` naming ``what`` if unencodable."""
    try:
        return _norm(value, what)
    except _Unencodable as e:
        raise TypeError(_message(what, e)) from None


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
    return tuple(out)


def _message(what: str, e: _Unencodable) -> str:
    return (
        f"argument {e.path!s} is a {type(e.value).__qualname__}, which incr cannot use as a key "
        f"(got {_short(e.value)}); pass None, bool, int, float, str, bytes, tuple, list, "
        f"dict with str keys, frozenset or an Input, or call incr.register_type() for it"
    )


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


_BUILTIN = {type(None), bool, int, float, str, bytes, tuple, list, dict, frozenset}
