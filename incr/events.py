"""What an LLM node's control loop reports while it runs: typed events for ``rt.on_event``.

``rt.on_event(callback)`` subscribes ``callback(event)`` to every event of the runtime and
returns a function that unsubscribes it. Events are plain frozen records; each names the node
instance it is about (``label``, the same text as ``rt.explain`` and ``incr inspect`` use).

- :class:`GenerationStarted` / :class:`GenerationFinished` (tokens, cost, seconds) -- one
  model call of a node.
- :class:`Verdict` -- one verdict recorded for a candidate revision (a validator's, a
  recheck's, an ``rt.nack``/``rt.ack``'s or a ``Reject``'s).
- :class:`Accepted` -- a candidate revision became the node's accepted value.
- :class:`Withdrawn` -- an accepted candidate was withdrawn (a NACK from outside, or a failed
  re-validation).
- :class:`Regression` -- a revision lost a case an earlier revision had ACKed;
  :class:`Reverted` -- so the next generation starts from the best revision instead.
- :class:`Warning` -- a monitor passed 80% of its threshold (a budget, the divergence
  patience): the loop has not stopped yet.
- :class:`Stopped` -- the loop ended without acceptance (``reason`` as ``NotAccepted.reason``);
  :class:`Halted` (a ``Stopped`` with ``reason="halted"``) when ``rt.halt`` stopped it before
  a model call (it goes on after ``rt.resume()``).
- :class:`ValidationFinished` -- one validator judged one candidate revision (seconds, the
  kinds of the verdicts it gave).
- :class:`PassStarted` / :class:`PassFinished` -- one pass of ``rt.stabilize()`` (label
  ``"stabilize"``): the revision, what was recomputed, the seconds, the error if any.
- :class:`ValidatorChanged` -- an audit record: a validator of the node has another identity
  (code or version) than the one its stored verdicts were made by; those are history now.

Callbacks run on the thread running the loop (a worker thread for a generator call made
ahead), must be quick, and must not call back into the runtime. An exception in a callback is
reported as a ``RuntimeWarning`` and never changes what the loop does.
"""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["Event", "GenerationStarted", "GenerationFinished", "Verdict", "Accepted",
           "Withdrawn", "Regression", "Reverted", "Warning", "Stopped", "Halted", "ValidatorChanged",
           "ValidationFinished", "PassStarted", "PassFinished"]


@attrs.frozen
class Event:
    """Base of every event: ``label`` names the node instance."""
    label: str


@attrs.frozen
class GenerationStarted(Event):
    attempt: int                  # the node's model calls in this context, this one included


@attrs.frozen
class GenerationFinished(Event):
    attempt: int
    tokens: int
    cost: float
    seconds: float
    error: str = ""               # the exception's type and text when the call failed


@attrs.frozen
class Verdict(Event):
    validator: str                # validator id (or "rt.nack", "reject:...", "<node>.recheck")
    revision: int
    verdict: Any                  # the incr.ACK / NACK / UNKNOWN


@attrs.frozen
class Accepted(Event):
    revision: int


@attrs.frozen
class Withdrawn(Event):
    revision: int
    why: str


@attrs.frozen
class Regression(Event):
    revision: int                 # the revision that lost the cases
    lost: tuple                   # ((validator id, case), ...) ACKed before, not now
    best: int                     # the best revision so far


@attrs.frozen
class Reverted(Event):
    revision: int                 # the revision set aside
    to: int                       # the revision the next generation starts from


@attrs.frozen
class Warning(Event):             # noqa: A001 -- incr.events.Warning, as the contract names it
    monitor: str                  # "attempts", "tokens", "cost", "seconds", "graph ...", "patience"
    used: float
    limit: float


@attrs.frozen
class Stopped(Event):
    reason: str


@attrs.frozen
class Halted(Stopped):
    """rt.halt stopped the loop before a model call (``reason`` is ``"halted"``; ``why`` is the
    reason given to ``rt.halt``)."""
    why: str = ""


@attrs.frozen
class ValidatorChanged(Event):
    validator: str
    old: str                      # the version its earlier verdicts were made by
    new: str


@attrs.frozen
class ValidationFinished(Event):
    validator: str
    revision: int
    seconds: float
    verdicts: tuple               # the kinds, in order: ("ACK", "NACK", ...)


@attrs.frozen
class PassStarted(Event):
    revision: int


@attrs.frozen
class PassFinished(Event):
    revision: int
    recomputed: tuple             # labels, in order
    seconds: float
    error: str = ""               # the first error's type and text, if the pass raised
