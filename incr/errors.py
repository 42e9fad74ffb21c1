"""The exceptions incr raises. All of them derive from :class:`IncrError`."""

from __future__ import annotations


class IncrError(Exception):
    """Base class of every error incr raises on its own account."""


class CycleError(IncrError):
    """A cell demanded itself, directly or through other cells.

    ``cycle`` holds the labels of the instances on the cycle, in call order, starting and
    ending with the instance that was demanded again.
    """

    def __init__(self, cycle: list[str]):
        self.cycle = list(cycle)
        super().__init__("cycle between cells: " + " -> ".join(self.cycle))


class ReentrancyError(IncrError):
    """A change (``Input.set``, ``batch``, ``stabilize``, ``observe``) was made from inside a
    running cell or while the runtime was propagating a change."""


class StoreError(IncrError):
    """The store cannot be read, written or opened."""


class NotPersistableWarning(UserWarning):
    """A cell's value cannot be encoded by the key codec, so it stays in memory only."""
