"""The exceptions incr raises. All of them derive from :class:`IncrError`.

A leaf: this module imports nothing of incr. What Reject needs of the LLM package (the check
of its arguments, the revision it rejects) is the hook ``_reject_args``, which incr.llmnodes
sets when it loads (``import incr`` loads it).
"""

from __future__ import annotations

_reject_args = None     # incr.llmnodes._reject_args


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


class NotAccepted(IncrError):
    """An LLM node's loop stopped without an accepted candidate.

    ``reason`` is one of ``"budget"``, ``"oscillation"``, ``"no_progress"``,
    ``"validator_unstable"``, ``"unknown"``, ``"halted"`` (``rt.halt``); ``report`` is
    readable text (attempts, verdicts, counterexamples, why it stopped); ``best`` is the
    candidate with the most distinct ACKs, or None; ``label`` names the node instance.
    """

    def __init__(self, label: str, reason: str, report: str, best=None, attempts: int = 0):
        self.label = label
        self.reason = reason
        self.report = report
        self.best = best
        self.attempts = attempts
        super().__init__(f"{label} was not accepted ({reason}) after {attempts} "
                         f"attempt{'s' if attempts != 1 else ''}; see .report")

    def __reduce__(self):
        return (type(self), (self.label, self.reason, self.report, self.best, self.attempts))


class Reject(IncrError):
    """Raised inside a cell or validator: the candidate of ``node(*args)`` that this
    computation consumed is wrong. The computation is aborted, a NACK (``case``,
    ``counterexample``, ``message``) is recorded against that candidate's revision, the node
    and everything that read it are withdrawn, the node alone generates again with the
    counterexample as feedback, and what was aborted runs again.

    Derives from IncrError (an Exception): a cell that catches every Exception also catches
    this one, and then nothing is rejected.
    """

    def __init__(self, node, *args, case: str = "rejected", counterexample=None,
                 message: str = ""):
        # the checks of the arguments, and the revision consumed and by whom (known now,
        # while the rejecting computation runs): incr.llmnodes._reject_args
        check = _reject_args
        revision, by = (None, None) if check is None else check(node, args, case,
                                                                  counterexample, message)
        self.node = node
        self.node_args = args
        self.case = case
        self.counterexample = counterexample
        self.message = message
        self.revision, self.by = revision, by
        label = getattr(node, "__qualname__", repr(node))
        super().__init__(f"{label}{args!r} rejected on case {case!r}"
                         + (f": {message}" if message else ""))


class _Deferred(BaseException):
    """Internal: an LLM node's generator call was set aside to run concurrently with others
    (inside ``stabilize``). A BaseException, so that cells catching Exception let it pass;
    it never reaches users."""


class _Suspend(_Deferred):
    """Internal: a sync computation inside a running event loop needs async work done first
    (an async cell's run, an async generator's or validator's call). It unwinds, recording
    nothing, to the nearest await of incr (incr._aio), which does the work (``works``: what
    to do, each once) and runs the computation again."""

    def __init__(self, works):
        super().__init__("incr: waiting for async work")
        self.works = works


class _OutOfTime(Exception):
    """Internal: an LLM node's generator call was still in flight when its
    ``Budget(max_seconds)`` ran out (cancelled if async, abandoned if sync). The loop ends
    ``NotAccepted(reason="budget")``."""
