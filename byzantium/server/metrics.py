"""The server's Prometheus metrics (prometheus-client; one registry per app), named as vLLM names its own
with our prefix: vLLM's `vllm:X` is our `byzantium:X`, the same suffix and the same type.

As vLLM (label model_name):
    byzantium:time_to_first_token_seconds    histogram  the request arrived at the server -> its first token
    byzantium:time_per_output_token_seconds  histogram  per request: (last token - first) / (tokens - 1)
    byzantium:e2e_request_latency_seconds    histogram  arrived -> finished (stop or length)
    byzantium:request_queue_time_seconds     histogram  given to the engine -> the step that first computes it
    byzantium:request_prompt_tokens          histogram  per prompt (n choices of one prompt: once)
    byzantium:request_generation_tokens      histogram  per engine request (each choice)
    byzantium:request_success_total          counter    finished_reason: stop, length, abort, error
    byzantium:num_requests_running           gauge
    byzantium:num_requests_waiting           gauge
    byzantium:prompt_tokens_total            counter    every request that reached the engine, aborted ones too
    byzantium:generation_tokens_total        counter    the same; an aborted request: the tokens it had
    byzantium:prefix_cache_queries_total     counter    prompt tokens of admitted requests
    byzantium:prefix_cache_hits_total        counter    of those, found in the KV cache
    byzantium:num_preemptions_total          counter
    byzantium:kv_cache_usage_perc            gauge      KV blocks in use / blocks in the pool (0..1)
Ours: byzantium:http_requests_total{route,status} (every HTTP request, refused ones too: 400, 401, 404,
413, 429, 503), byzantium:kv_blocks_used / kv_blocks_total / sessions_open (gauges),
byzantium:step_seconds_total{phase} and byzantium:steps_total (counters).
"""
from __future__ import annotations

import re
import time

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..engine.sequence import Status

# Histogram buckets (upper bounds, seconds): vLLM's, with finer low ones where a CPU or a small model lands.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
QUEUE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0,
                 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


# prometheus-client adds a `_created` gauge (a timestamp) to each counter and histogram; vLLM's scrapes and
# dashboards have no use for them, so they are left out of what /metrics answers.
_CREATED = re.compile(rb"^(?:# (?:HELP|TYPE) )?byzantium:\w+_created[ {].*\n", re.M)


def token_buckets(max_model_len):
    """1, 2, 5, 10, 20, 50, ... up to the longest context served (vLLM's build_1_2_5_buckets)."""
    out, exponent = [], 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10 ** exponent
            if value > max_model_len:
                return tuple(out)
            out.append(value)
        exponent += 1


def end_reason(seq):
    """The finished_reason label of an engine request that ended (or that was given up: `abort`)."""
    reason = getattr(seq, "finish_reason", None)
    if reason in (None, "abort"):
        return "abort"
    if reason in ("length", "error"):
        return reason
    return "stop"


class _EngineCollector:
    """Read from each engine when scraped."""

    def __init__(self, server):
        self.server = server

    def collect(self):
        gauges = {name: GaugeMetricFamily(f"byzantium:{name}", help, labels=["model_name"]) for name, help in (
            ("num_requests_running", "requests in the running batch"),
            ("num_requests_waiting", "requests waiting to be scheduled"),
            ("kv_cache_usage_perc", "KV cache blocks in use / blocks in the pool (0..1)"),
            ("kv_blocks_used", "KV cache blocks in use"),
            ("kv_blocks_total", "KV cache blocks in the pool"),
            ("sessions_open", "sessions open (/v1/sessions)"))}
        seconds = CounterMetricFamily("byzantium:step_seconds", "engine step time attributed to each phase",
                                      labels=["model_name", "phase"])
        steps = CounterMetricFamily("byzantium:steps", "engine steps (forward passes)", labels=["model_name"])
        preemptions = CounterMetricFamily("byzantium:num_preemptions", "requests preempted (recomputed later)",
                                          labels=["model_name"])
        for served in self.server.models.values():
            engine, name = served.engine, served.name
            totals = engine.engine.step_records.totals
            used, total = engine.engine.block_manager.num_used, engine.engine.num_blocks
            gauges["num_requests_running"].add_metric([name], engine.num_running)
            gauges["num_requests_waiting"].add_metric([name], served.waiting)
            gauges["kv_cache_usage_perc"].add_metric([name], used / total if total else 0.0)
            gauges["kv_blocks_used"].add_metric([name], used)
            gauges["kv_blocks_total"].add_metric([name], total)
            gauges["sessions_open"].add_metric([name], sum(s is served for s, _ in self.server.sessions.values()))
            seconds.add_metric([name, "prefill"], totals["prefill_ns"] / 1e9)
            seconds.add_metric([name, "decode"], totals["decode_ns"] / 1e9)
            steps.add_metric([name], totals["steps"])
            preemptions.add_metric([name], totals["preemptions"])
        yield from gauges.values()
        yield seconds
        yield steps
        yield preemptions


class Track:
    """One engine request (a choice, or a session turn) from the server's side: observed after every
    engine step it is told of, reported to the metrics once when it ends, however it ends."""

    __slots__ = ("metrics", "served", "arrival", "count_prompt", "queued", "scheduled", "first", "ended")

    def __init__(self, metrics, served, arrival, count_prompt):
        self.metrics, self.served, self.arrival, self.count_prompt = metrics, served, arrival, count_prompt
        self.queued = time.perf_counter()
        self.scheduled = self.first = None
        self.ended = False

    def observe(self, seq):
        now = time.perf_counter()
        m, name = self.metrics, self.served.name
        if self.scheduled is None and (seq.status is not Status.WAITING or seq.num_output or seq.finish_reason):
            self.scheduled = self._step_start(seq, now)
            m.queue_time.labels(name).observe(max(0.0, self.scheduled - self.queued))
        if self.first is None and seq.num_output > 0:
            self.first = now
            m.ttft.labels(name).observe(max(0.0, now - self.arrival))

    def _step_start(self, seq, now):
        """When the step that first computed `seq` began (the engine's step record), else now."""
        stats = self.served.engine.engine.step_records
        records = stats.records
        if records and seq.seq_id in records[-1].requests:
            return stats.origin + records[-1].start_ns / 1e9
        return now

    def end_unstarted(self, prompt):
        """Count a request given up before the engine's first step told of it (the client gone, the
        shutdown): an abort, with its prompt tokens (token ids; a session turn's are not known here)."""
        if self.ended:
            return
        self.ended = True
        m, name = self.metrics, self.served.name
        m.success.labels(name, "abort").inc()
        if self.count_prompt and isinstance(prompt, (list, tuple)):
            m.prompt_tokens.labels(name).inc(len(prompt))

    def end(self, seq):
        """Count the request: its end reason, its tokens (those it had, when aborted), and its latencies
        when it finished. seq None: it never reached the engine (refused), nothing to count."""
        if self.ended or seq is None:
            return
        self.ended = True
        now = time.perf_counter()
        m, name = self.metrics, self.served.name
        reason = end_reason(seq)
        prompt, generated = seq.output_start, max(0, len(seq.token_ids) - seq.output_start)
        m.success.labels(name, reason).inc()
        m.generation_tokens.labels(name).inc(generated)
        if self.count_prompt:
            m.prompt_tokens.labels(name).inc(prompt)
        if self.scheduled is not None:
            cached = seq.turn_start if seq.pinned else (seq.num_cached_tokens or 0)
            m.cache_queries.labels(name).inc(prompt)
            m.cache_hits.labels(name).inc(min(cached, prompt))
        if reason in ("stop", "length"):
            m.e2e.labels(name).observe(max(0.0, now - self.arrival))
            m.generation_hist.labels(name).observe(generated)
            if self.count_prompt:
                m.prompt_hist.labels(name).observe(prompt)
            if self.first is not None and generated >= 2:
                m.tpot.labels(name).observe(max(0.0, now - self.first) / (generated - 1))


class Metrics:
    def __init__(self, server):
        r = self.registry = CollectorRegistry()
        labels = ["model_name"]
        longest = max((s.max_model_len for s in server.models.values()), default=1)
        self.http_requests = Counter("byzantium:http_requests", "HTTP requests by route and status code",
                                     ["route", "status"], registry=r)
        self.success = Counter("byzantium:request_success", "engine requests ended, by finished_reason",
                               ["model_name", "finished_reason"], registry=r)
        self.prompt_tokens = Counter("byzantium:prompt_tokens", "prompt tokens (aborted requests too)", labels,
                                     registry=r)
        self.generation_tokens = Counter("byzantium:generation_tokens",
                                         "generated tokens (aborted requests: those generated so far)", labels,
                                         registry=r)
        self.cache_queries = Counter("byzantium:prefix_cache_queries", "prompt tokens of admitted requests",
                                     labels, registry=r)
        self.cache_hits = Counter("byzantium:prefix_cache_hits", "prompt tokens found in the KV cache", labels,
                                  registry=r)
        self.ttft = Histogram("byzantium:time_to_first_token_seconds",
                              "seconds from the request's arrival to its first token", labels,
                              buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("byzantium:time_per_output_token_seconds",
                              "per request: seconds from its first to its last token / (tokens - 1)", labels,
                              buckets=TPOT_BUCKETS, registry=r)
        self.e2e = Histogram("byzantium:e2e_request_latency_seconds",
                             "seconds from the request's arrival to its end (finished requests)", labels,
                             buckets=E2E_BUCKETS, registry=r)
        self.queue_time = Histogram("byzantium:request_queue_time_seconds",
                                    "seconds from entering the engine's queue to the step that first runs it",
                                    labels, buckets=QUEUE_BUCKETS, registry=r)
        self.prompt_hist = Histogram("byzantium:request_prompt_tokens", "prompt tokens of finished requests",
                                     labels, buckets=token_buckets(longest), registry=r)
        self.generation_hist = Histogram("byzantium:request_generation_tokens",
                                         "generated tokens of finished requests", labels,
                                         buckets=token_buckets(longest), registry=r)
        r.register(_EngineCollector(server))
        for name in server.models:  # every series from the start, at 0 (as vLLM)
            for metric in (self.prompt_tokens, self.generation_tokens, self.cache_queries, self.cache_hits,
                           self.ttft, self.tpot, self.e2e, self.queue_time, self.prompt_hist, self.generation_hist):
                metric.labels(name)
            for reason in ("stop", "length", "abort", "error"):
                self.success.labels(name, reason)

    def track(self, served, arrival, count_prompt=True):
        return Track(self, served, arrival, count_prompt)

    def http_request(self, route, status):
        self.http_requests.labels(route, str(status)).inc()

    def render(self):
        return _CREATED.sub(b"", generate_latest(self.registry)), CONTENT_TYPE_LATEST
