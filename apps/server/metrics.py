"""The server's Prometheus metrics, on a registry of its own (never the process-global one).

Events are recorded as they happen (:meth:`ServerMetrics.observe_request`, :meth:`count_cache`,
:meth:`count_blocked`); the state of the process is read only when /metrics is scraped, through callables the
server hands in (queue depth, slots busy, resident models, cache counters, RSS, device temperature), so no
thread polls the engine. A callable that fails is logged and its gauge left out of that scrape; a reading that
does not exist (no thermal sensor on the board) is left out too, never replaced by a made-up value.

Names (units in the name, as Prometheus asks):
  edgerun_ttft_seconds{model,version,priority}                histogram, time to the first token
  edgerun_request_seconds{model,version,priority,status}      histogram, end to end
  edgerun_tokens_total{model,kind=prompt|completion}          counter
  edgerun_requests_total{model,version,status}                counter
  edgerun_cache_hits_total{cache=prefix|result}, edgerun_cache_misses_total{cache}
  edgerun_blocked_total{stage=input|output,reason}            counter
  edgerun_queue_depth{model,priority}, edgerun_slots_busy{model}, edgerun_resident_models,
  edgerun_model_planned_bytes{model,version,kind}, edgerun_memory_plan_bytes{part=used|reserve|budget},
  edgerun_process_rss_bytes, edgerun_device_temperature_celsius,
  edgerun_tokens_per_second{model} (completion tokens over the last ``rate_window_s``)   gauges
  edgerun_spec_drafted_total{model}, edgerun_spec_accepted_total{model}   counters, speculative decoding: draft
  tokens verified and accepted; edgerun_spec_acceptance_ratio{model} (accepted / drafted)   gauge
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from devices.live import cpu_temperature_c, read_thermal_zones
from devices.rootfs import RootFS
from runtime.metrics import rss_bytes

log = logging.getLogger(__name__)

# Time to first token on a small box: a result-cache hit in milliseconds, a long prompt's prefill on a Pi in
# tens of seconds.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0)
# End to end: the same start, up to a long generation on a slow CPU.
REQUEST_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
CACHES = ("prefix", "result")


def device_temperature_c(root: str = "/") -> float | None:
    """The CPU's temperature from the board's thermal zones (devices.live), None when it has no readable sensor."""
    return cpu_temperature_c(read_thermal_zones(RootFS.at(root)))


def label(value: Any) -> str:
    """A label value: a Priority (or any enum) by its lower-case name, anything else as text."""
    name = getattr(value, "name", None)
    return name.lower() if isinstance(name, str) else str(value)


class ServerMetrics:
    """Sources (each optional, each a no-argument callable read at scrape time):

    - ``queue_depth() -> {model: {priority: n}}`` (priority a Priority or its name)
    - ``slots_busy() -> {model: n}``
    - ``resident() -> [{"name", "version", "kind", "planned_bytes", ...}]`` (ResidencyManager.resident)
    - ``memory() -> {"used_bytes", "reserve_bytes", "budget_bytes", ...}`` (ResidencyManager.stats; other keys
      are ignored)
    - ``caches() -> {"prefix"|"result": {"hits": n, "misses": n}}`` cumulative counts kept elsewhere (the
      ResultCache's and the engine's stats), added to those given to :meth:`count_cache`
    - ``speculation() -> {model: {"drafted": n, "accepted": n}}`` cumulative draft tokens verified and accepted
      (the engines' stats)
    - ``rss() -> bytes`` (default: this process's resident set), ``temperature() -> °C | None`` (default: the
      CPU's thermal zone)
    """

    def __init__(self, registry: CollectorRegistry | None = None, *,
                 queue_depth: Callable[[], Mapping[str, Mapping[Any, int]]] | None = None,
                 slots_busy: Callable[[], Mapping[str, int]] | None = None,
                 resident: Callable[[], Sequence[Mapping[str, Any]]] | None = None,
                 memory: Callable[[], Mapping[str, int]] | None = None,
                 caches: Callable[[], Mapping[str, Mapping[str, int]]] | None = None,
                 speculation: Callable[[], Mapping[str, Mapping[str, int]]] | None = None,
                 rss: Callable[[], int] | None = rss_bytes,
                 temperature: Callable[[], float | None] | None = device_temperature_c,
                 rate_window_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.sources: dict[str, Callable[[], Any] | None] = {}
        self.bind(queue_depth=queue_depth, slots_busy=slots_busy, resident=resident, memory=memory, caches=caches,
                  speculation=speculation, rss=rss, temperature=temperature)
        self.rate_window_s, self.clock = rate_window_s, clock
        self._lock = threading.Lock()
        self._cache_counts: dict[tuple[str, str], int] = defaultdict(int)
        self._completions: dict[str, deque[tuple[float, int]]] = defaultdict(deque)
        self._started = clock()
        r = self.registry
        self.ttft = Histogram("edgerun_ttft_seconds", "Time from request to the first token", ["model", "version", "priority"],
                              buckets=TTFT_BUCKETS, registry=r)
        self.request_seconds = Histogram("edgerun_request_seconds", "Request latency end to end",
                                         ["model", "version", "priority", "status"], buckets=REQUEST_BUCKETS, registry=r)
        self.tokens = Counter("edgerun_tokens", "Tokens processed", ["model", "kind"], registry=r)
        self.requests = Counter("edgerun_requests", "Requests answered", ["model", "version", "status"], registry=r)
        self.blocked = Counter("edgerun_blocked", "Requests blocked by the content filters", ["stage", "reason"], registry=r)
        r.register(_StateCollector(self))

    def bind(self, **sources: Callable[[], Any] | None) -> None:
        """Set or replace sources after construction (the engine may be built after the metrics)."""
        valid = ("queue_depth", "slots_busy", "resident", "memory", "caches", "speculation", "rss", "temperature")
        for name, fn in sources.items():
            if name not in valid:
                raise TypeError(f"unknown metrics source {name!r}; valid: {', '.join(valid)}")
            if fn is not None and not callable(fn):
                raise TypeError(f"metrics source {name!r} must be callable, not {type(fn).__name__}")
            self.sources[name] = fn

    def observe_request(self, *, model: str, version: str, priority: Any, status: str | int, total_s: float,
                        ttft_s: float | None = None, prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
        """One finished request (answered, refused or failed). ``ttft_s`` None: no token was produced."""
        prio, status = label(priority), label(status)
        if ttft_s is not None:
            self.ttft.labels(model, version, prio).observe(ttft_s)
        self.request_seconds.labels(model, version, prio, status).observe(total_s)
        self.requests.labels(model, version, status).inc()
        if prompt_tokens:
            self.tokens.labels(model, "prompt").inc(prompt_tokens)
        if completion_tokens:
            self.tokens.labels(model, "completion").inc(completion_tokens)
            now = self.clock()
            with self._lock:
                events = self._completions[model]
                events.append((now, completion_tokens))
                self._prune(events, now)  # not only at scrape time: a server nobody scrapes keeps the window only

    def count_cache(self, cache: str, hit: bool, n: int = 1) -> None:
        if cache not in CACHES:
            raise ValueError(f"unknown cache {cache!r}; valid: {', '.join(CACHES)}")
        with self._lock:
            self._cache_counts[(cache, "hits" if hit else "misses")] += n

    def count_blocked(self, stage: str, reason: str) -> None:
        self.blocked.labels(stage, reason).inc()

    def tokens_per_second(self) -> dict[str, float]:
        """Completion tokens (counted when their request ends) per second per model over the last ``rate_window_s``
        (or the uptime, if shorter, but at least one second)."""
        now = self.clock()
        span = max(min(self.rate_window_s, now - self._started), 1.0)  # a first request is not a rate
        out = {}
        with self._lock:
            for model, events in self._completions.items():
                self._prune(events, now)
                out[model] = sum(n for _, n in events) / span
        return out

    def _prune(self, events: deque[tuple[float, int]], now: float) -> None:
        while events and events[0][0] < now - self.rate_window_s:
            events.popleft()

    def cache_counts(self) -> dict[tuple[str, str], int]:
        """{(cache, "hits"|"misses"): n}: this object's counts plus the ``caches`` source's."""
        with self._lock:
            counts = dict(self._cache_counts)
        for cache, stats in (self._read("caches") or {}).items():
            for kind in ("hits", "misses"):
                counts[(cache, kind)] = counts.get((cache, kind), 0) + int(stats.get(kind, 0))
        return counts

    def render(self) -> tuple[bytes, str]:
        """(body, content type) for GET /metrics: Prometheus text format 0.0.4."""
        return generate_latest(self.registry), CONTENT_TYPE_PLAIN_0_0_4  # every Prometheus reads 0.0.4

    def _read(self, name: str) -> Any:
        fn = self.sources.get(name)
        if fn is None:
            return None
        try:
            return fn()
        except Exception as exc:  # a scrape never fails because one source did
            log.warning("metrics source %s failed: %s: %s", name, type(exc).__name__, exc)
            return None


class _StateCollector(Collector):
    """The gauges and the cache counters, read from the sources at scrape time."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.m = metrics

    def describe(self) -> list[Metric]:
        return []  # the metric names are dynamic only in their samples; no describe-time reads of the sources

    def collect(self) -> Iterator[Metric]:
        m = self.m
        hits = CounterMetricFamily("edgerun_cache_hits", "Cache hits", labels=["cache"])
        misses = CounterMetricFamily("edgerun_cache_misses", "Cache misses", labels=["cache"])
        counts = m.cache_counts()
        for cache in sorted({c for c, _ in counts} | set(CACHES)):
            hits.add_metric([cache], counts.get((cache, "hits"), 0))
            misses.add_metric([cache], counts.get((cache, "misses"), 0))
        yield hits
        yield misses

        queue = GaugeMetricFamily("edgerun_queue_depth", "Requests waiting, per model and priority", labels=["model", "priority"])
        for model, depth in (m._read("queue_depth") or {}).items():
            for prio, n in depth.items():
                queue.add_metric([model, label(prio)], n)
        yield queue

        drafted = CounterMetricFamily("edgerun_spec_drafted", "Speculative decoding: draft tokens verified", labels=["model"])
        accepted = CounterMetricFamily("edgerun_spec_accepted", "Speculative decoding: draft tokens accepted",
                                       labels=["model"])
        ratio = GaugeMetricFamily("edgerun_spec_acceptance_ratio", "Speculative decoding: accepted / drafted tokens",
                                  labels=["model"])
        for model, counts in sorted((m._read("speculation") or {}).items()):
            n, ok = int(counts.get("drafted", 0)), int(counts.get("accepted", 0))
            drafted.add_metric([model], n)
            accepted.add_metric([model], ok)
            if n:  # no drafts yet: no ratio, rather than a made-up 0
                ratio.add_metric([model], ok / n)
        yield drafted
        yield accepted
        yield ratio

        busy = GaugeMetricFamily("edgerun_slots_busy", "Decode slots in use, per model", labels=["model"])
        for model, n in (m._read("slots_busy") or {}).items():
            busy.add_metric([model], n)
        yield busy

        resident = m._read("resident")
        count = GaugeMetricFamily("edgerun_resident_models", "Models loaded now")
        planned = GaugeMetricFamily("edgerun_model_planned_bytes", "Planned bytes of each resident model",
                                    labels=["model", "version", "kind"])
        if resident is not None:
            count.add_metric([], len(resident))
            # A model swapped for the same version holds two entries until the old one's last lease ends: one
            # sample per label set (a repeated one makes the whole scrape invalid), with both plans summed.
            summed: dict[tuple[str, str, str], float] = defaultdict(float)
            for entry in resident:
                key = (str(entry.get("name", "")), str(entry.get("version", "")), str(entry.get("kind", "")))
                summed[key] += entry.get("planned_bytes", 0)
            for key, value in summed.items():
                planned.add_metric(list(key), value)
        yield count
        yield planned

        plan = GaugeMetricFamily("edgerun_memory_plan_bytes", "The memory plan: used by resident models, reserve, budget",
                                 labels=["part"])
        for part, value in sorted((m._read("memory") or {}).items()):
            if part.endswith("_bytes"):
                plan.add_metric([part.removesuffix("_bytes")], value)
        yield plan

        rss = GaugeMetricFamily("edgerun_process_rss_bytes", "Resident set size of the server process")
        value = m._read("rss")
        if value is not None:
            rss.add_metric([], value)
        yield rss

        temp = GaugeMetricFamily("edgerun_device_temperature_celsius", "CPU temperature from the board's thermal zone")
        value = m._read("temperature")
        if value is not None:
            temp.add_metric([], value)
        yield temp

        rate = GaugeMetricFamily("edgerun_tokens_per_second", "Completion tokens per second over the recent window",
                                 labels=["model"])
        for model, value in sorted(m.tokens_per_second().items()):
            rate.add_metric([model], value)
        yield rate
