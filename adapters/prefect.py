"""incr for Prefect 3: content-keyed caching and tasks that run as incr cells.

Two ways in, from the smallest change to the largest:

``IncrCachePolicy`` (``INCR_KEY``) is a Prefect ``CachePolicy`` whose key is incr's content
key of the call: the canonical encoding of the task's arguments (``incr.keys.encode``: ``1``,
``1.0`` and ``True`` are three keys, dict order is irrelevant, nothing is pickled) and the
identity of the code that runs. Where Prefect's ``TASK_SOURCE`` hashes the source text of the
task function only, the identity here covers its bytecode and default values, what its closure
holds, the module-level names it reads (constants by value; functions of the user's own package
by code, recursively; incr cells by identity) and, for an ``@incr.llm`` node, its validators'
ids and versions::

    from prefect import task
    from incr.adapters.prefect import INCR_KEY

    @task(cache_policy=INCR_KEY)            # instead of INPUTS + TASK_SOURCE
    def clean(rows: list) -> list: ...

``incremental_task`` makes a Prefect task whose body runs as an incr cell on an incr
``Runtime``: the body runs only if that call was never computed or something it read (an
``incr.Input``, another cell or incremental task) changed since; with a store, a later flow
run (another process) takes the value from the store without running the body::

    from incr.adapters.prefect import incremental_task

    @incremental_task(runtime=".incr")      # instead of @task
    def clean(rows: list) -> list: ...

Prefect's own result persistence stays Prefect's business (its serializer is its choice); the
keys incr computes never need pickle, and incr's store never holds a pickle.

Cost: a key is O(size of the encoded arguments + size of the code and the module-level values
it reads); an incremental task adds one demand on the runtime (O(1) when reused).
"""

from __future__ import annotations

import atexit
import functools
import inspect
import os
import threading
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

try:
    import prefect
    from prefect.cache_policies import NO_CACHE, CachePolicy
except ImportError as e:  # only without the extra
    raise ImportError(
        "incr.adapters.prefect needs Prefect: pip install 'incr[prefect]' "
        f"(prefect>=3). ({e})") from e

import incr
from incr import keys as _keys
from incr.errors import NotPersistableWarning
from incr.llmnodes import Validator

__all__ = [
    "INCR_KEY",
    "IncrCachePolicy",
    "cell_of",
    "incremental_task",
    "shared_runtime",
    "task_identity",
]

_KEY_FORMAT = "prefect-2"      # bump when what goes into a key changes: old keys then miss
                               # (2: arguments keyed by name, so f(x=1) and f(y=1) differ)


# --- identity of the code a task runs --------------------------------------------------------


def _is_cell(v: Any) -> bool:
    return isinstance(v, incr.Cell)


def _package(mod: str | None) -> str:
    return (mod or "?").split(".", 1)[0]


def _code_names(code: types.CodeType) -> set[str]:
    names: set[str] = set()
    stack = [code]
    while stack:
        c = stack.pop()
        names.update(c.co_names)
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return names


_global_values: dict[tuple[str, str], bytes] = {}   # (function, global) -> hash last keyed on


def _watch_global(fn_name: str, ref: str, encoded: bytes) -> None:
    """Warn once when a module-level value a task reads changes while the process runs: it is
    then state (a log, a memo) rather than configuration, and it changes the key every time."""
    h = _keys.digest("value", encoded)
    old = _global_values.get((fn_name, ref))
    _global_values[(fn_name, ref)] = h
    if old is not None and old != h:
        _warn_once(("global", fn_name, ref),
                   f"incr.adapters.prefect: {fn_name} reads the module-level {ref}, whose value "
                   f"changed while this process ran; it is part of the task's key (as a "
                   f"configuration constant should be), so the task misses the cache after "
                   f"each change. If {ref} is state rather than configuration, keep it out of "
                   f"module globals, or use IncrCachePolicy(follow_globals=False) and a "
                   f"version")


class _Describer:
    """Names what a task's code depends on, as canonical data (internal).

    ``exact`` turns False when a closure holds a value that can only be named by its type: the
    key would then not tell two different tasks apart, and the policy does not cache.
    """

    def __init__(self, follow_globals: bool, root_package: str):
        self.follow_globals = follow_globals
        self.root_package = root_package
        self.seen: dict[int, int] = {}      # id(function) -> index in self.parts (this key only)
        self.parts: list = []
        self.exact = True
        self.unnamed: list[str] = []

    def function(self, fn: Callable, version: Any = None) -> int:
        """Describe ``fn`` (once per key; a recursion points back at its first description)."""
        at = self.seen.get(id(fn))
        if at is not None:
            return at
        at = self.seen[id(fn)] = len(self.parts)
        self.parts.append(None)
        name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
        if version is not None:
            own: list = [name, "v", str(version)]
        else:
            own = [name, "c", _keys.code_fingerprint(fn)]
            for i, c in enumerate(getattr(fn, "__closure__", None) or ()):
                try:
                    v = c.cell_contents
                except ValueError:  # an empty closure cell
                    own.append(None)
                    continue
                own.append(self.value(v, f"{name} closure variable "
                                         f"{fn.__code__.co_freevars[i]}", closure=True))
        refs: list = []
        code = getattr(fn, "__code__", None)
        g = getattr(fn, "__globals__", None)
        if self.follow_globals and code is not None and g is not None:
            for ref in sorted(_code_names(code)):
                if ref in g:
                    named = self.value(g[ref], f"{name} global {ref}", closure=False)
                    if named[0] == "V":
                        _watch_global(name, ref, named[1])
                    refs.append([ref, named])
        self.parts[at] = [own, refs]
        return at

    def value(self, v: Any, where: str, closure: bool) -> Any:
        if _is_cell(v):
            ident = _keys.cell_identity(v)
            if ident is None:
                self._unnamed(where, closure)
                return ["?C", v.name]
            return ["C", ident]
        if isinstance(v, Validator):
            return ["A", v.id, v.version]
        if isinstance(v, prefect.Task):
            v = v.fn
            if _is_cell(v):
                return self.value(v, where, closure)
        if isinstance(v, types.FunctionType):
            holder = getattr(v, "__incr_holder__", None)   # an incremental task's runner
            if holder is not None:
                return self.value(holder.get(), where, closure)
            if _package(v.__module__) == self.root_package:
                return ["F", self.function(v)]
            return ["N", f"{v.__module__}.{v.__qualname__}"]
        if isinstance(v, types.ModuleType):
            return ["M", v.__name__]
        if isinstance(v, type):
            return ["K", f"{v.__module__}.{v.__qualname__}"]
        if isinstance(v, (types.BuiltinFunctionType, types.MethodType, functools.partial)):
            return ["N", repr(getattr(v, "__qualname__", type(v).__qualname__))]
        try:
            return ["V", _keys.encode(v)]
        except TypeError:
            if closure:
                self._unnamed(where, closure)
            return ["T", f"{type(v).__module__}.{type(v).__qualname__}"]

    def _unnamed(self, where: str, closure: bool) -> None:
        if closure:
            self.exact = False
            self.unnamed.append(where)


def _describe(fn: Callable, version: Any, follow_globals: bool) -> tuple[list | None, list]:
    """(canonical description of what ``fn`` runs, or None; what could not be named)."""
    holder = getattr(fn, "__incr_holder__", None)   # an incremental task's runner
    target = holder.get() if holder is not None else fn
    if _is_cell(target):
        ident = _keys.cell_identity(target)
        if ident is None:
            return None, [f"{target.name} (it shares its identity with another live cell)"]
        body = getattr(target, "gen", None) or target.fn   # an LLM node's generator
        d = _Describer(follow_globals, _package(getattr(body, "__module__", None)))
        if follow_globals:
            # the cell's identity decides whether it can be named; this adds what it reads
            # at module level and the full identity of the cells its closure holds (incr's
            # closure fingerprint names those by code only, not by validator versions)
            d.function(body)
        return [_KEY_FORMAT, "cell", ident, None if version is None else str(version),
                d.parts], []
    if version is None and not isinstance(getattr(fn, "__code__", None), types.CodeType):
        # a callable object (or anything else without Python code): incr cannot name what it
        # runs, and keying it by its type would give two different objects one key
        return None, [f"{fn!r} (it has no Python code to fingerprint)"]
    d = _Describer(follow_globals, _package(getattr(fn, "__module__", None)))
    d.function(fn, version)
    if not d.exact:
        return None, d.unnamed
    return [_KEY_FORMAT, "fn", d.parts], []


def task_identity(fn: Callable, *, version: Any = None, follow_globals: bool = True,
                  hash: str = "xxh3_128") -> str | None:
    """The identity of the code ``fn`` runs, as a hex digest, or None when it cannot be named.

    ``fn`` is a function, an incr cell or LLM node, a Prefect task or an incremental task. Two
    functions with the same source text but different closure values, default values, module
    constants, callees (of the same package) or validator versions get different identities.

    >>> def make(k):
    ...     def scale(x):
    ...         return x * k
    ...     return scale
    >>> task_identity(make(2)) != task_identity(make(3))
    True

    Runtime complexity: O(code and module-level values reachable from ``fn``).
    """
    if isinstance(fn, prefect.Task):
        fn = fn.fn
    desc, _ = _describe(fn, version, follow_globals)
    if desc is None:
        return None
    return _keys.digest("cell", _keys.encode(desc, "task identity"), hash).hex()


# --- the cache policy ------------------------------------------------------------------------

_warned: set = set()
_warned_lock = threading.Lock()


def _warn_once(key: Any, message: str) -> None:
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, NotPersistableWarning, stacklevel=3)


def _signature(fn: Callable) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


@dataclass
class IncrCachePolicy(CachePolicy):
    """A Prefect cache policy keyed by incr's content key of the call.

    The key is a hash of the task's identity (see :func:`task_identity`) and the canonical
    encoding of its bound arguments (defaults applied, in signature order). A call whose
    arguments incr cannot encode, or whose closure holds a value that can only be named by its
    type, is not cached: the task runs, with one ``incr.NotPersistableWarning`` per task saying
    what to do (``incr.register_type`` for the argument's type; ``version=`` for the closure).

    - ``version``: names the task's definition instead of a hash of its code and closure (bump
      it when something the hash cannot see changes). Module-level names it reads are still
      followed.
    - ``follow_globals``: also key on the module-level names the code reads (default True).
    - ``hash``: ``"xxh3_128"`` (default) or ``"blake2b"``, as for ``incr.Runtime``.
    - ``exclude``: argument names left out of the key, as for Prefect's ``Inputs``; written
      ``INCR_KEY - "client"`` (a new policy; ``self`` for a method whose instance does not
      matter). Subtract before adding: Prefect's compound policy passes a subtraction to its
      ``Inputs`` members only, so ``(INCR_KEY + RUN_ID) - "x"`` still keys ``x`` (a miss or
      a warning, never a wrong hit); write ``(INCR_KEY - "x") + RUN_ID``.

    Arguments are keyed by name and value (``f(x=1)`` and ``f(y=1)`` are two keys; ``f(1, 2)``
    and ``f(b=2, a=1)`` one, as Prefect binds them). Combines with Prefect's policies like any
    other: ``INCR_KEY + RUN_ID`` caches within one flow run only; ``.configure(key_storage=,
    lock_manager=, isolation_level=)`` works as for Prefect's own. Raises nothing: a key that
    cannot be made is ``None`` (Prefect then runs the task and does not cache it).
    """

    version: Any = None
    follow_globals: bool = True
    hash: str = "xxh3_128"
    exclude: list[str] = field(default_factory=list)

    def __sub__(self, other: str) -> IncrCachePolicy:
        if not isinstance(other, str):
            raise TypeError(f"IncrCachePolicy: only an argument name (a str) can be "
                            f"subtracted, got {other!r}")
        return replace(self, exclude=[*self.exclude, other])

    def compute_key(self, task_ctx: Any, inputs: dict[str, Any] | None,
                    flow_parameters: dict[str, Any] | None, **kwargs: Any) -> str | None:
        fn = getattr(task_ctx, "task", None) if task_ctx else None
        if fn is None:
            return None     # no task to key the code of (Prefect's Inputs would key inputs)
        return self.key_for(fn, inputs or {})

    def key_for(self, fn: Callable, parameters: dict[str, Any]) -> str | None:
        """The key of calling ``fn`` with ``parameters`` (Prefect's name -> value mapping).

        Runtime complexity: O(encoded arguments + the code reachable from ``fn``).
        """
        if isinstance(fn, prefect.Task):
            fn = fn.fn
        label = getattr(fn, "__qualname__", None) or repr(fn)
        desc, unnamed = _describe(fn, self.version, self.follow_globals)
        if desc is None:
            _warn_once(("closure", label),
                       f"incr.adapters.prefect: task {label} is not cached: "
                       f"{', '.join(unnamed)} can only be named by its type, so the key "
                       f"could not tell this task from another; give the policy a version "
                       f"(IncrCachePolicy(version=...)) and bump it when that value changes")
            return None
        sig = _signature(fn)
        order = list(sig.parameters) if sig is not None else []
        # by name, in signature order, then any other name Prefect passed (sorted): a
        # positional tuple would give f(x=1) and f(y=1) one key
        names = [n for n in order if n in parameters]
        names += sorted(n for n in parameters if n not in set(order))
        names = [n for n in names if n not in self.exclude]
        args = tuple((n, parameters[n]) for n in names)
        try:
            args_b = _keys.encode(args, "arguments")
        except TypeError:
            for n in names:
                try:
                    _keys.encode(parameters[n], n)
                except TypeError as e:
                    why = str(e)
                    try:  # the engine's message names the argument and the way out
                        _keys.normalize_args(label, (n,), (parameters[n],))
                    except TypeError as named:
                        why = str(named)
                    _warn_once(("arg", label, n),
                               f"incr.adapters.prefect: task {label} is not cached: {why}. "
                               f"Or leave it out of the key: cache_policy=INCR_KEY - "
                               f"\"{n}\"; or never cache this task: cache_policy=NO_CACHE")
                    break
            return None
        ident = _keys.digest("cell", _keys.encode(desc, "task identity"), self.hash).hex()
        return _keys.instance_key(ident, args_b, self.hash).hex()


INCR_KEY = IncrCachePolicy()
"""The default :class:`IncrCachePolicy`: a drop-in for ``INPUTS + TASK_SOURCE``."""


# --- tasks that run as incr cells ------------------------------------------------------------

_locks: dict = {}               # Runtime -> RLock: one demand at a time per runtime
_locks_lock = threading.Lock()
_shared: dict = {}              # absolute store path -> Runtime opened by shared_runtime (a
                                # forked child keeps using it: the store reopens itself there)


def _lock_for(rt: Any) -> threading.RLock:
    lock = _locks.get(rt)
    if lock is None:
        with _locks_lock:
            lock = _locks.setdefault(rt, threading.RLock())
    return lock


def shared_runtime(store: str | os.PathLike) -> incr.Runtime:
    """The process-wide ``incr.Runtime`` on ``store`` (opened on first use, closed at exit).

    Every incremental task given ``runtime=<that path>`` runs on it, so tasks of one process
    share one trace. Raises ``incr.StoreError`` if the store cannot be opened.
    """
    path = os.path.abspath(os.fspath(store))
    rt = _shared.get(path)
    if rt is None or rt.closed:
        with _locks_lock:
            rt = _shared.get(path)
            if rt is None or rt.closed:
                # "sync": a task that finished is stored before the next one starts, so a
                # killed worker never runs a finished task again (Prefect's unit of work)
                rt = _shared[path] = incr.Runtime(store=path, durability="sync")
    return rt


@atexit.register
def _close_shared() -> None:  # pragma: no cover - runs at interpreter exit
    for rt in list(_shared.values()):
        try:
            rt.close()
        except Exception:  # noqa: BLE001, S110 - at exit there is nobody left to tell
            pass


def _runtime_of(runtime: Any) -> incr.Runtime:
    if runtime is None:
        return incr.current()
    if isinstance(runtime, incr.Runtime):
        return runtime
    if isinstance(runtime, (str, os.PathLike)):
        return shared_runtime(runtime)
    if callable(runtime):
        return _runtime_of(runtime())
    raise TypeError(f"incremental_task: runtime must be an incr.Runtime, a store path, a "
                    f"callable returning one, or None (the active runtime), got {runtime!r}")


class _LazyCell:
    """The incr cell of an incremental task, made at its first use (internal): by then the
    module-level names its code reads exist, so its identity can cover them."""

    def __init__(self, fn: Callable, version: Any, cutoff: Any, follow_globals: bool):
        self.fn, self.version, self.cutoff = fn, version, cutoff
        self.follow_globals = follow_globals
        self.cell = fn if isinstance(fn, incr.Cell) else None
        self.lock = threading.Lock()

    def get(self) -> incr.Cell:
        c = self.cell
        if c is None:
            with self.lock:
                if self.cell is None:
                    version = self.version
                    if version is None and self.follow_globals:
                        ident = task_identity(self.fn)
                        version = None if ident is None else "g:" + ident[2:34]
                    self.cell = incr.Cell(self.fn, version=version, cutoff=self.cutoff)
                c = self.cell
        return c


def cell_of(t: Any) -> incr.Cell:
    """The incr cell an incremental task runs (for ``rt.explain(cell_of(t), ...)``,
    ``rt.observe``, ``rt.state`` of an LLM node). Raises TypeError for any other task."""
    holder = getattr(getattr(t, "fn", t), "__incr_holder__", None)
    if holder is None:
        raise TypeError(f"cell_of: {t!r} is not made by incr.adapters.prefect.incremental_task")
    return holder.get()


def incremental_task(fn: Callable | None = None, /, *, runtime: Any = None, version: Any = None,
                     cutoff: Any = incr.EQUAL, follow_globals: bool = True,
                     **task_options: Any) -> Any:
    """Make a Prefect task whose body runs as an incr cell.

    Use like ``@task``, bare or with options. ``runtime`` is the ``incr.Runtime`` the cell runs
    on: a Runtime, a store path (the process-wide :func:`shared_runtime` on it), a callable
    returning one, or None for whichever runtime is active when the task runs
    (``incr.current()``; ``with rt: my_flow()`` makes it ``rt``). ``version`` and ``cutoff``
    are ``incr.cell``'s. Without ``version``, and with ``follow_globals`` (the default), the
    cell is versioned by :func:`task_identity` taken at its first call, so that its stored
    entries also depend on the module constants and same-package helpers its code reads (in
    a later process; a value changed in place while the process runs is not seen). Every
    other keyword goes to ``prefect.task``; ``cache_policy`` defaults to ``NO_CACHE`` (incr
    decides what runs; Prefect caching on top would not see what the body read). ``fn`` may
    already be an incr cell or an ``@incr.llm`` node.

    A call runs the body only if that instance was never computed on the runtime (and, with a
    store, is not in the store with dependencies that hash the same), or if something it read
    on its last run changed. Otherwise Prefect records a completed task run and the body does
    not run. Calls on one runtime are serialized (one demand at a time); an exception from
    the body reaches Prefect unchanged and nothing partial is kept, so retries run it again.

    Raises TypeError for a bad ``runtime`` (when the task runs), a non-callable ``fn``, or an
    async or generator function (a coroutine or generator cannot be reused).
    """
    def make(f: Callable) -> Any:
        if not callable(f):
            raise TypeError(f"incremental_task needs a function, got {f!r}")
        if inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f) or \
                inspect.isgeneratorfunction(f):
            raise TypeError(f"incremental_task {f.__qualname__}: an incr cell returns a value; "
                            f"an async or generator function returns a coroutine or generator, "
                            f"which cannot be reused. Make it a plain function (or use "
                            f"@task(cache_policy=INCR_KEY) for it)")
        holder = _LazyCell(f, version, cutoff, follow_globals)

        @functools.wraps(f)
        def run(*args: Any, **kwargs: Any) -> Any:
            rt = _runtime_of(runtime)
            cell = holder.get()
            with _lock_for(rt), rt:
                return cell(*args, **kwargs)

        run.__incr_holder__ = holder
        options = dict(task_options)
        options.setdefault("cache_policy", NO_CACHE)
        return prefect.task(run, **options)

    return make if fn is None else make(fn)
