"""OpenTelemetry spans (fastnsq.otel): a publish and its handling as one trace on HA ext topics,
message ids on upstream spans, nothing when uninstrumented."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the tests need opentelemetry-sdk (the 'test' extra)")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import fastnsq.otel
from fastnsq import Consumer, Producer, tracing

from .helpers import eventually, unique
from .test_ha import consumer_on, ha_topic


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    fastnsq.otel.instrument(provider)
    try:
        yield exporter
    finally:
        fastnsq.otel.uninstrument()
    assert not tracing.ENABLED


async def test_publish_and_handle_on_an_ha_ext_topic_are_one_trace(nsq_cluster_ha, spans) -> None:
    topic = await ha_topic(nsq_cluster_ha, ext=True, partitions=2)
    handled = asyncio.Event()
    inner: list = []

    def handle(message):
        from opentelemetry import trace

        inner.append(trace.get_current_span().get_span_context())  # the handler runs inside its span
        handled.set()

    consumer = consumer_on(nsq_cluster_ha, topic, handler=handle)
    await consumer.start()
    try:
        async with Producer(lookupd_http_addresses=nsq_cluster_ha.lookupd_http_addresses) as producer:
            await producer.publish(topic, b"traced body", ext={"app": "test"})
        await asyncio.wait_for(handled.wait(), 30)
    finally:
        await consumer.stop()
    finished = spans.get_finished_spans()
    (publish,) = [s for s in finished if s.kind is SpanKind.PRODUCER]
    (process,) = [s for s in finished if s.kind is SpanKind.CONSUMER]
    assert publish.name == f"publish {topic}" and process.name == f"process {topic}"
    assert process.context.trace_id == publish.context.trace_id
    assert process.parent is not None and process.parent.span_id == publish.context.span_id
    assert inner[0].span_id == process.context.span_id
    assert process.attributes["messaging.consumer.group.name"] == "ch"
    assert len(process.attributes["messaging.message.id"]) == 32  # HA: 16 binary bytes as hex


async def test_upstream_spans_carry_the_message_id(nsqd, spans) -> None:
    topic = unique("otel")
    ids: list[str] = []

    async def handle(message):  # an async handler: its span covers the awaits
        await asyncio.sleep(0)
        ids.append(message.id.decode())

    async with Producer([nsqd.tcp_address]) as producer:
        await producer.publish(topic, b"one")
        await producer.mpublish(topic, [b"two", b"three"])
    consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], handler=handle, max_in_flight=5)
    await consumer.start()
    try:
        await eventually(lambda: len(ids) == 3, what="three handled")
        await eventually(lambda: len([s for s in spans.get_finished_spans() if s.kind is SpanKind.CONSUMER]) == 3,
                         what="three consumer spans ended")
    finally:
        await consumer.stop()
    finished = spans.get_finished_spans()
    producers = [s for s in finished if s.kind is SpanKind.PRODUCER]
    assert sorted(s.attributes.get("messaging.batch.message_count", 1) for s in producers) == [1, 2]
    consumers = [s for s in finished if s.kind is SpanKind.CONSUMER]
    assert sorted(s.attributes["messaging.message.id"] for s in consumers) == sorted(ids)
    assert all(s.parent is None for s in consumers)  # plain bodies carry no context


async def test_a_failing_handler_marks_its_span(nsqd, spans) -> None:
    topic = unique("otelfail")
    attempts: list[int] = []

    def handle(message):
        attempts.append(message.attempts)
        if message.attempts == 1:
            raise RuntimeError("first attempt fails")

    async with Producer([nsqd.tcp_address]) as producer:
        await producer.publish(topic, b"x")
    consumer = Consumer(topic, "ch", nsqd_tcp_addresses=[nsqd.tcp_address], handler=handle,
                        default_requeue_delay=0, max_backoff_duration=0, hold_failed=False)
    await consumer.start()
    try:
        await eventually(lambda: attempts == [1, 2], timeout=20, what="a failed and a good attempt")
    finally:
        await consumer.stop()
    statuses = [s.status.status_code.name for s in spans.get_finished_spans() if s.kind is SpanKind.CONSUMER]
    assert statuses == ["ERROR", "UNSET"]


def test_uninstrumented_nothing_is_hooked() -> None:
    assert not tracing.ENABLED and not tracing.HOOKED
