"""OpenTelemetry spans for a runtime (the optional extra ``incr[otel]``).

``incr.otel.instrument(rt)`` subscribes to ``rt.on_event`` and turns what the runtime reports
into spans of the ``incr`` tracer (from ``tracer_provider``, else the global one):

- ``incr.stabilize`` -- one per pass of ``rt.stabilize()``: attributes ``incr.revision``,
  ``incr.recomputed`` (how many instances ran), status ERROR if the pass raised;
- ``incr.generate`` -- one per model call of an LLM node, a child of the pass it ran in:
  ``incr.node``, ``incr.attempt``, ``incr.tokens``, ``incr.cost``;
- ``incr.validate`` -- one per validator run on a candidate, a child of the pass:
  ``incr.node``, ``incr.validator``, ``incr.revision``, ``incr.verdicts`` (e.g. "ACK,NACK");
- the loop's other events (verdicts, accepted, withdrawn, regression, reverted, warning,
  stopped) are span events on the pass span (or on a span of their own outside a pass).

Spans carry the real start and end times of what they measure (a generation's span starts
when the call started, in whichever thread made it). It returns a function that stops the
instrumentation. Every event also goes to the ``incr.llm`` logger at DEBUG level without
this module.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from incr import events

try:
    from opentelemetry import trace
    from opentelemetry.trace import Status, StatusCode
except ImportError as e:      # pragma: no cover - exercised by tests/test_adapter_missing_extra
    raise ImportError("incr.otel needs OpenTelemetry: pip install 'incr[otel]' (the "
                      "opentelemetry-sdk package)") from e

__all__ = ["instrument"]


def instrument(rt, *, tracer_provider=None) -> Callable[[], None]:
    """Make spans of ``rt``'s passes, model calls and validations (see the module doc).
    Returns ``uninstrument()``."""
    tracer = trace.get_tracer("incr", tracer_provider=tracer_provider)
    lock = threading.Lock()
    state: dict[str, Any] = {"pass": None, "starts": {}}

    def ns_ago(seconds: float) -> int:
        return time.time_ns() - int(seconds * 1e9)

    def parent_ctx():
        span = state["pass"]
        return None if span is None else trace.set_span_in_context(span)

    def on(e) -> None:
        with lock:
            if isinstance(e, events.PassStarted):
                if state["pass"] is not None:          # the last pass was interrupted
                    state["pass"].set_status(Status(StatusCode.ERROR, "interrupted"))
                    state["pass"].end()
                state["pass"] = tracer.start_span("incr.stabilize",
                                                  attributes={"incr.revision": e.revision})
            elif isinstance(e, events.PassFinished):
                span, state["pass"] = state["pass"], None
                if span is None:
                    return
                span.set_attribute("incr.recomputed", len(e.recomputed))
                span.set_attribute("incr.revision", e.revision)
                if e.error:
                    span.set_status(Status(StatusCode.ERROR, e.error))
                span.end()
            elif isinstance(e, events.GenerationStarted):
                state["starts"][(e.label, e.attempt)] = time.time_ns()
            elif isinstance(e, events.GenerationFinished):
                start = state["starts"].pop((e.label, e.attempt), None) or ns_ago(e.seconds)
                span = tracer.start_span("incr.generate", context=parent_ctx(),
                                         start_time=start, attributes={
                                             "incr.node": e.label, "incr.attempt": e.attempt,
                                             "incr.tokens": e.tokens, "incr.cost": e.cost})
                if e.error:
                    span.set_status(Status(StatusCode.ERROR, e.error))
                span.end()
            elif isinstance(e, events.ValidationFinished):
                span = tracer.start_span("incr.validate", context=parent_ctx(),
                                         start_time=ns_ago(e.seconds), attributes={
                                             "incr.node": e.label, "incr.validator": e.validator,
                                             "incr.revision": e.revision,
                                             "incr.verdicts": ",".join(e.verdicts)})
                span.end()
            else:
                attrs = {"incr.node": e.label}
                for k, v in _fields(e).items():
                    attrs[f"incr.{k}"] = v
                name = f"incr.{type(e).__name__}"
                if state["pass"] is not None:
                    state["pass"].add_event(name, attrs)
                else:
                    span = tracer.start_span(name, attributes=attrs)
                    span.end()

    return rt.on_event(on)


def _fields(e) -> dict:
    """An event's fields as span attributes (str, int, float or bool; others as text)."""
    import attrs
    out = {}
    for a in attrs.fields(type(e)):
        if a.name == "label":
            continue
        v = getattr(e, a.name)
        if not isinstance(v, (str, int, float, bool)):
            v = repr(v)
        out[a.name] = v
    return out
