# Typed stub of the compiled engine (incr/_core.pyx). Public names are re-exported by incr.
from typing import Any, Callable, Generic, TypeVar, ParamSpec

P = ParamSpec("P")
R = TypeVar("R")

class _CutoffPolicy:
    name: str

EQUAL: _CutoffPolicy
IDENTITY: _CutoffPolicy
NEVER: _CutoffPolicy
DEEP: int

def current() -> Runtime: ...

class Node:
    value: Any

class Input(Node):
    @property
    def name(self) -> str: ...
    def get(self) -> Any: ...
    def set(self, value: Any) -> None: ...
    @property
    def changed_at_revision(self) -> int: ...

class Instance(Node):
    @property
    def cell(self) -> Cell[..., Any]: ...
    @property
    def args(self) -> tuple[Any, ...]: ...
    @property
    def label_text(self) -> str: ...
    @property
    def timestamp(self) -> int: ...

class Cell(Generic[P, R]):
    fn: Callable[P, R]
    name: str
    version: Any
    cutoff: _CutoffPolicy | Callable[[Any, Any], bool]
    qualname_label: str
    def __init__(
        self,
        fn: Callable[P, R],
        *,
        version: Any = ...,
        cutoff: _CutoffPolicy | Callable[[Any, Any], bool] = ...,
        local: bool = ...,
    ) -> None: ...
    local: bool
    is_llm: bool
    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R: ...

class Stabilization:
    recomputed: list[str]
    cutoff: list[str]
    loaded: list[str]
    reused: int
    seconds: float
    revision: int

class Observer:
    @property
    def runtime(self) -> Runtime: ...
    @property
    def value(self) -> Any: ...
    @property
    def label(self) -> str: ...
    def on_change(self, callback: Callable[[Any], Any]) -> Callable[[Any], Any]: ...
    def stop(self) -> None: ...

class _Batch:
    def __enter__(self) -> Runtime: ...
    def __exit__(self, *exc: object) -> bool: ...

class Runtime:
    revision: int
    closed: bool
    store_path: Any
    hash: str
    max_workers: int | None
    executor: Any
    extensions: dict[str, Any]
    def __init__(
        self,
        store: Any = ...,
        *,
        hash: str = ...,
        max_workers: int | None = ...,
        max_bytes: int | None = ...,
        executor: Any = ...,
    ) -> None: ...
    def __enter__(self) -> Runtime: ...
    def __exit__(self, *exc: object) -> bool: ...
    def input(self, name: str, value: Any = ...) -> Input: ...
    def batch(self) -> _Batch: ...
    def observe(self, cell: Cell[..., Any], *args: Any, **kwargs: Any) -> Observer: ...
    def stabilize(self) -> Stabilization: ...
    def explain(self, cell: Cell[..., Any], *args: Any, **kwargs: Any) -> str: ...
    def stats(self) -> dict[str, int]: ...
    def state(self, node: Cell[..., Any], *args: Any, **kwargs: Any) -> Any: ...
    def nack(self, node: Cell[..., Any], *args: Any, revision: int, case: str,
             counterexample: Any = ..., message: str = ..., **kwargs: Any) -> None: ...
    def ack(self, node: Cell[..., Any], *args: Any, revision: int, case: str,
            evidence: Any = ..., **kwargs: Any) -> None: ...
    def close(self) -> None: ...
    def _check(self) -> bool: ...
    def _instances(self) -> list[Instance]: ...
