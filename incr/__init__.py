"""incr — incremental computation for Python functions.

Wrap functions as cells, declare inputs, change an input: only what depends on the change runs
again, and a recomputed value equal to the old one stops the propagation there (cutoff).

>>> import incr
>>> rt = incr.Runtime()                  # in memory
>>> price = rt.input("price", 10.0)
>>> qty = rt.input("qty", 3)
>>> @incr.cell
... def subtotal():
...     return price.get() * qty.get()
>>> @incr.cell
... def total(tax):
...     return round(subtotal() * (1 + tax), 2)
>>> with rt:
...     total(0.2)                       # computes subtotal, then total
...     qty.set(4)                       # revision 1: subtotal and total are stale
...     total(0.2)                       # recomputes both, nothing else
36.0
48.0
>>> print(rt.explain(total, 0.2))        # doctest: +ELLIPSIS
total(0.2) was recomputed at revision 1 because subtotal() changed at revision 1...

The contract is in the project's API.md; the words it uses are in docs/glossary.md, LLM
nodes (generators accepted under validator evidence) in docs/llm.md.
"""

from __future__ import annotations

try:
    from incr import _core  # noqa: F401 - fail here, loudly, if the core was not built
except ImportError as e:  # pragma: no cover - only without a build
    raise ImportError(
        "incr's compiled core (incr._core) is missing or does not load: install incr with "
        "`pip install .` (or `pip install -e .`) so that the Cython extension is built; "
        f"incr has no pure-Python fallback. ({e})"
    ) from e

from incr._core import (
    EQUAL,
    IDENTITY,
    NEVER,
    Cell,
    Input,
    Observer,
    Runtime,
    Stabilization,
    current,
    gather,
    untracked,
)
from incr.collections import Fold, IncrMap, InputMap, MapView, input_map
from incr.errors import (
    CycleError,
    IncrError,
    NotAccepted,
    NotPersistableWarning,
    ReentrancyError,
    Reject,
    StoreError,
)
from incr import events
from incr.keys import register_type
from incr.llmnodes import (
    ACK,
    NACK,
    UNKNOWN,
    Acceptance,
    Budget,
    Candidate,
    NodeState,
    effect,
    llm,
    validator,
)

__all__ = [
    "ACK",
    "NACK",
    "UNKNOWN",
    "Acceptance",
    "Budget",
    "Candidate",
    "NodeState",
    "NotAccepted",
    "Reject",
    "effect",
    "events",
    "llm",
    "validator",
    "EQUAL",
    "IDENTITY",
    "NEVER",
    "Cell",
    "Fold",
    "IncrMap",
    "InputMap",
    "MapView",
    "input_map",
    "CycleError",
    "IncrError",
    "Input",
    "NotPersistableWarning",
    "Observer",
    "ReentrancyError",
    "Runtime",
    "Stabilization",
    "StoreError",
    "cell",
    "current",
    "register_type",
    "gather",
    "untracked",
]

__version__ = "0.1.0"


def cell(fn=None, /, *, version=None, cutoff=EQUAL, local=False):
    """Make ``fn`` an incremental cell.

    Use bare (``@incr.cell``) or with options (``@incr.cell(version="2", cutoff=incr.NEVER)``).
    ``cutoff`` decides when a recomputed value counts as unchanged: ``incr.EQUAL`` (the same
    value: same type and ``==`` all the way down, 0.0 and -0.0 apart, NaN equal to NaN, dicts
    in the same order; the default), ``incr.IDENTITY`` (``is``), ``incr.NEVER`` (always changed) or a
    ``callable(old, new) -> bool`` that returns True for "unchanged". ``version`` names the
    cell's definition for persistent stores. ``local=True`` keeps the cell in this process when
    the runtime has an executor (``Runtime(executor=...)``).

    Raises TypeError if ``fn`` is not callable or ``cutoff`` is none of the above.
    """
    if fn is None:
        return lambda f: Cell(f, version=version, cutoff=cutoff, local=local)
    return Cell(fn, version=version, cutoff=cutoff, local=local)
