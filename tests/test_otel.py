"""incr.otel: OpenTelemetry spans from a runtime's events, with the real SDK (in-memory
exporter): a span per stabilize pass, children per model call and validation, with tokens,
cost and verdicts; events of the loop as span events."""

from __future__ import annotations

import pytest

import incr

sdk = pytest.importorskip("opentelemetry.sdk.trace", reason="needs the incr[otel] extra "
                          "(opentelemetry-sdk)")
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_a_pass_with_two_attempts_makes_one_tree_of_spans(spans):
    from incr import otel
    provider, exporter = spans
    answers = iter([incr.Candidate("-a", tokens=11, cost=0.5), incr.Candidate("+a", tokens=7)])

    @incr.validator(version="1")
    def check(c, x):
        yield incr.ACK("a") if "+a" in c else incr.NACK("a", counterexample=c)

    @incr.llm(validators=[check])
    def node(x, *, previous=None, feedback=()):
        return next(answers)

    rt = incr.Runtime(max_workers=1)
    off = otel.instrument(rt, tracer_provider=provider)
    obs = rt.observe(node, 0)
    rt.stabilize()
    assert obs.value == "+a"
    got = {s.name: [] for s in exporter.get_finished_spans()}
    for s in exporter.get_finished_spans():
        got[s.name].append(s)
    (passed,) = got["incr.stabilize"]
    gens, vals = got["incr.generate"], got["incr.validate"]
    assert [g.attributes["incr.tokens"] for g in gens] == [11, 7]
    assert [g.attributes["incr.cost"] for g in gens] == [0.5, 0.0]
    assert [v.attributes["incr.verdicts"] for v in vals] == ["NACK", "ACK"]
    for child in gens + vals:
        assert child.parent is not None and child.parent.span_id == passed.context.span_id
        assert passed.start_time <= child.start_time <= child.end_time <= passed.end_time
    names = [e.name for e in passed.events]
    assert "incr.Verdict" in names and "incr.Accepted" in names
    assert passed.attributes["incr.recomputed"] == 1
    off()
    rt.stabilize()
    assert len(exporter.get_finished_spans()) == 5          # nothing after uninstrument


def test_a_failed_pass_is_an_error_span_and_a_call_outside_a_pass_a_root_span(spans):
    from incr import otel
    provider, exporter = spans

    @incr.llm(budget=incr.Budget(max_attempts=1), validators=[incr.validator(version="1")(
        lambda c, x: incr.NACK("no", counterexample=c))])
    def node(x, *, previous=None, feedback=()):
        return "x"

    rt = incr.Runtime(max_workers=1)
    otel.instrument(rt, tracer_provider=provider)
    rt.observe(node, 0)
    with pytest.raises(incr.NotAccepted):
        rt.stabilize()
    (passed,) = [s for s in exporter.get_finished_spans() if s.name == "incr.stabilize"]
    assert passed.status.status_code.name == "ERROR" and "NotAccepted" in passed.status.description
    exporter.clear()
    with rt, pytest.raises(incr.NotAccepted):
        node(1)                                          # a top-level demand: no pass
    gen = [s for s in exporter.get_finished_spans() if s.name == "incr.generate"]
    assert len(gen) == 1 and gen[0].parent is None
