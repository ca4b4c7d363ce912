"""The server's Prometheus metrics (prometheus-client; one registry per app): requests by model, endpoint
and status; prompt, cached and generated tokens; and, read from each engine when scraped, running and
waiting sequences, KV blocks in use and step seconds by phase."""
from __future__ import annotations

from fastapi.responses import StreamingResponse
from prometheus_client import CollectorRegistry, Counter, generate_latest, CONTENT_TYPE_LATEST
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class _EngineCollector:
    def __init__(self, server):
        self.server = server

    def collect(self):
        gauges = {name: GaugeMetricFamily(f"byzantium_{name}", help, labels=["model"]) for name, help in (
            ("running_sequences", "sequences in the running batch"),
            ("waiting_sequences", "requests waiting to be scheduled"),
            ("kv_blocks_used", "KV cache blocks in use"),
            ("kv_blocks_total", "KV cache blocks in the pool"),
            ("sessions_open", "sessions open (/v1/sessions)"))}
        seconds = CounterMetricFamily("byzantium_step_seconds", "engine step time attributed to each phase",
                                      labels=["model", "phase"])
        steps = CounterMetricFamily("byzantium_steps", "engine steps (forward passes)", labels=["model"])
        for served in self.server.models.values():
            engine, name = served.engine, served.name
            stats = engine.engine.step_records.totals
            gauges["running_sequences"].add_metric([name], engine.num_running)
            gauges["waiting_sequences"].add_metric([name], served.waiting)
            gauges["kv_blocks_used"].add_metric([name], engine.engine.block_manager.num_used)
            gauges["kv_blocks_total"].add_metric([name], engine.engine.num_blocks)
            gauges["sessions_open"].add_metric([name], sum(s is served for s, _ in self.server.sessions.values()))
            seconds.add_metric([name, "prefill"], stats["prefill_ns"] / 1e9)
            seconds.add_metric([name, "decode"], stats["decode_ns"] / 1e9)
            steps.add_metric([name], stats["steps"])
        yield from gauges.values()
        yield seconds
        yield steps


class _Request:
    """Counts one request by its outcome: the status of the APIError it raised, 500 for anything else, or
    200; a streamed response is counted when its stream ends."""

    def __init__(self, metrics, model, endpoint):
        self.metrics, self.model, self.endpoint, self.streaming = metrics, model, endpoint, False

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        if not self.streaming or kind is not None:
            self.metrics.requests.labels(self.model, self.endpoint, str(getattr(error, "status", 500) if kind else 200)).inc()

    def stream(self, events):
        self.streaming = True

        async def counted():
            status = "200"
            try:
                async for event in events:
                    yield event
            except BaseException:
                status = "499"  # the client went away (or the server is stopping)
                raise
            finally:
                self.metrics.requests.labels(self.model, self.endpoint, status).inc()
        return StreamingResponse(counted(), media_type="text/event-stream")


class Metrics:
    def __init__(self, server):
        self.registry = CollectorRegistry()
        self.requests = Counter("byzantium_requests", "HTTP requests by model, endpoint and status",
                                ["model", "endpoint", "status"], registry=self.registry)
        self.prompt_tokens = Counter("byzantium_prompt_tokens", "prompt tokens", ["model"], registry=self.registry)
        self.cached_tokens = Counter("byzantium_cached_tokens", "prompt tokens found in the KV cache",
                                     ["model"], registry=self.registry)
        self.generation_tokens = Counter("byzantium_generation_tokens", "generated tokens", ["model"],
                                         registry=self.registry)
        self.registry.register(_EngineCollector(server))

    def request(self, model, endpoint):
        return _Request(self, model, endpoint)

    def tokens(self, model, prompt, cached, generated):
        self.prompt_tokens.labels(model).inc(prompt)
        self.cached_tokens.labels(model).inc(cached)
        self.generation_tokens.labels(model).inc(generated)

    def render(self):
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
