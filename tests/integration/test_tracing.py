"""One order is one trace: submit, dispatch, agent, reply and supervisor share a trace id."""

from __future__ import annotations

import json

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from messaging.wire import decode_reply, decode_request
from simulator import SimulatorServer
from tests.support import FakeClock, drain, drain_requests, handle_request, make_context

_exporter = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def provider() -> None:
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(_exporter))
    trace.set_tracer_provider(tracer_provider)


def test_an_order_is_one_trace_across_every_hop(storage_connection: str, tag: str) -> None:
    clock = FakeClock()
    with SimulatorServer() as sim:
        ctx = make_context(storage_connection, tag, remote_url=sim.url, clock=clock)
        order_id = f"{tag}-traced"
        _exporter.clear()
        ctx.scheduler.submit(json.dumps({"orderId": order_id}).encode())
        [request_text] = drain_requests(ctx)
        request = decode_request(request_text)
        assert request.trace["traceparent"].startswith("00-")
        # The first attempt gets lost: the supervisor's retry stays in the same trace.
        clock.advance(40)
        ctx.supervisor.run()
        [dispatch] = drain(ctx, ctx.names.order_dispatch)
        ctx.scheduler.dispatch(json.loads(dispatch)["orderId"])
        [retry_text] = drain_requests(ctx)
        handle_request(ctx, retry_text)
        [reply_text] = drain(ctx, ctx.names.agent_replies)
        ctx.scheduler.apply_reply(decode_reply(reply_text))
    spans = [
        s for s in _exporter.get_finished_spans() if (s.attributes or {}).get("orderId") == order_id
    ]
    names = sorted(s.name for s in spans)
    assert names == sorted(
        [
            "order.submit",  # accepts and claims: no dispatch of its own
            "order.supervise",
            "order.dispatch",
            "agent.call",
            "order.reply",
        ]
    )
    assert len({s.context.trace_id for s in spans}) == 1
    by_id = {s.context.span_id: s for s in spans}
    agent = next(s for s in spans if s.name == "agent.call")
    assert agent.parent is not None and by_id[agent.parent.span_id].name == "order.dispatch"
    reply = next(s for s in spans if s.name == "order.reply")
    assert reply.parent is not None and by_id[reply.parent.span_id].name == "agent.call"
