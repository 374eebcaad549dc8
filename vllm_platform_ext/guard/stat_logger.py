"""The guard as one of vLLM's stat loggers, with its Prometheus metrics.

vLLM's ``StatLoggerBase`` (``vllm/v1/metrics/loggers.py``, the same interface on 0.23-0.34):
``record(scheduler_stats, iteration_stats, ...)`` once per engine step in the API server process,
``log()`` every few seconds, ``log_engine_initialized()`` once. The metrics are registered as
vLLM's ``PrometheusStatLogger`` registers its own (``prometheus_client``, the default registry, labels
``model_name`` and ``engine``, gauges ``multiprocess_mode="mostrecent"``), so vLLM's ``/metrics``
serves them; their names start with ``vllm_platform_ext:guard_``.
"""
from __future__ import annotations

import math
import time

from vllm.v1.metrics.loggers import StatLoggerBase

from vllm_platform_ext.guard import monitor

PREFIX = "vllm_platform_ext:guard_"
AL_BUCKETS = [1.0, 1.05, 1.1, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0]
_METRICS: dict = {}


def _unregister_own() -> None:
    """Drop collectors of an earlier guard logger in this process (vLLM's ``unregister_vllm_metrics``
    does the same for ``vllm:``), so a second engine in one process registers anew."""
    from prometheus_client import REGISTRY

    for collector in list(REGISTRY._collector_to_names):
        if getattr(collector, "_name", "").startswith(PREFIX):
            REGISTRY.unregister(collector)


def metrics() -> dict:
    """The guard's metric families, created once per process."""
    if _METRICS:
        return _METRICS
    from prometheus_client import Counter, Gauge, Histogram

    _unregister_own()
    labels = ["model_name", "engine"]

    def gauge(name, doc):
        return Gauge(PREFIX + name, doc, labelnames=labels, multiprocess_mode="mostrecent")

    _METRICS.update(
        incidents=Counter(PREFIX + "incidents", "Guard incidents (one warning each) by kind: loop, "
                          "acceptance_collapse, zero_acceptance, spec_slower", labelnames=labels + ["kind"]),
        request_al=Histogram(PREFIX + "request_acceptance_length", "Finished requests' mean generated tokens per "
                             "decode step (1 + accepted drafts), requests of 16+ decode steps", labelnames=labels,
                             buckets=AL_BUCKETS),
        baseline=gauge("acceptance_baseline", "Moving mean of the finished requests' acceptance length: what a "
                       "request's own is compared with"),
        engine_al=gauge("engine_acceptance_length", "Moving mean of 1 + accepted / drafts over the engine's "
                        "speculative steps"),
        zero_run=gauge("drafts_since_accept", "Draft tokens proposed since the last accepted one, engine-wide"),
        looping=gauge("requests_looping", "Running requests whose generated tokens end in a repetition loop"),
        tracked=gauge("tracked_requests", "Requests the guard holds state for (bounded)"),
        speedup=gauge("spec_speedup_estimate", "Speculative over plain decoding speed at the last batch bucket "
                      "judged: tokens per request per speculative step x draft-free step time / speculative step "
                      "time; NaN until both are measured"),
        seconds=Counter(PREFIX + "seconds", "Time the guard spent in its hooks (its overhead)", labelnames=labels),
        steps=Counter(PREFIX + "steps", "Engine steps the guard saw", labelnames=labels),
    )
    return _METRICS


class GuardStatLogger(StatLoggerBase):
    """Per-engine stat logger (vLLM wraps it in ``PerEngineStatLoggerAdapter``); every engine of the
    process feeds the one :class:`~vllm_platform_ext.guard.monitor.Guard`."""

    def __init__(self, vllm_config, engine_index: int = 0):
        spec = getattr(vllm_config, "speculative_config", None)
        k = int(getattr(spec, "num_speculative_tokens", 0) or 0) if spec is not None else 0
        method = str(getattr(spec, "method", "") or "") if spec is not None else ""
        mc = getattr(vllm_config, "model_config", None)
        self.model_name = str(getattr(mc, "served_model_name", None) or getattr(mc, "model", "") or "")
        self.engine_index = engine_index
        self.m = metrics()
        self.labels = [self.model_name, str(engine_index)]
        self.k, self.method = k, method
        guard = monitor.current()
        if guard is None or (guard.spec_k, guard.method) != (k, method):
            guard = monitor.install(monitor.Guard(k, method, sink=self._on_incident))
        self.guard = guard
        for kind in monitor.KINDS:  # every series present from the start, at 0
            self.m["incidents"].labels(*self.labels, kind)
        self.m["speedup"].labels(*self.labels).set(math.nan)
        self._seen_seconds = 0.0

    def _on_incident(self, inc) -> None:
        self.m["incidents"].labels(*self.labels, inc.kind).inc()

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
        g = monitor.current()
        if g is None:  # disabled after an error of its own
            return
        t0 = time.perf_counter()
        try:
            g.end_step(scheduler_stats, iteration_stats, engine_idx)
        except Exception as exc:  # the guard must never take the server down
            monitor.disable(exc)
            return
        m, lb = self.m, self.labels
        for al in g.finished_al:
            m["request_al"].labels(*lb).observe(al)
        g.finished_al.clear()
        if g.baseline.value is not None:
            m["baseline"].labels(*lb).set(g.baseline.value)
        if g.engine_al.value is not None:
            m["engine_al"].labels(*lb).set(g.engine_al.value)
        m["zero_run"].labels(*lb).set(g.drafts_since_accept)
        m["looping"].labels(*lb).set(g.looping)
        m["tracked"].labels(*lb).set(len(g.reqs))
        if g.speedup is not None:
            m["speedup"].labels(*lb).set(g.speedup)
        m["steps"].labels(*lb).inc()
        g.seconds += time.perf_counter() - t0  # end_step and the metric updates
        m["seconds"].labels(*lb).inc(max(0.0, g.seconds - self._seen_seconds))
        self._seen_seconds = g.seconds

    def log_engine_initialized(self):
        monitor._logger().info("vllm-platform-ext guard on (engine %d, speculation: %s): loop over %d tokens, "
                               "acceptance window %d steps; metrics %s*", self.engine_index,
                               f"{self.method} k={self.k}" if self.k else "none", monitor.LoopWatch().min_tokens,
                               monitor.ACCEPT_WINDOW, PREFIX)
