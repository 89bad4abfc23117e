"""Everything one server process holds: its config, keys, models, caches, metrics, filters and canary routers.

Built once by ``edgerun serve`` (or a test) and handed to :func:`apps.server.app.create_app`; the handlers read it
and keep nothing of their own.
"""

from __future__ import annotations

import logging
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

from apps.server.canary import CanaryRouter
from apps.server.config import ServeConfig
from apps.server.llm_service import EngineService
from apps.server.metrics import ServerMetrics
from apps.server.models import Models
from apps.server.security import ApiKeys, load_keys
from runtime.errors import EdgerunError, one_line
from runtime.serving.result_cache import ResultCache
from runtime.serving.safety import Blocklist, FilterChain, RegexFilter, SizeLimit

log = logging.getLogger(__name__)
COUNTERS = ("prefix_hits", "prefix_misses", "spec_drafted", "spec_accepted")  # an engine's cumulative counts


@dataclass(eq=False)
class _Served:
    """A loaded LLM the server has answered with, held weakly: the residency manager owns it, and once it is
    unloaded nothing here keeps it (its weights' host copies, its prefix cache) alive. ``counts``: its counters
    as last read, kept under its name when it is gone so that /metrics' counters never go back."""

    ref: weakref.ref
    name: str
    counts: dict[str, int] = field(default_factory=dict)


def _counters(stats: dict[str, Any]) -> dict[str, int]:
    cache = stats.get("prefix_cache", {})
    return {"prefix_hits": int(cache.get("hits", 0)), "prefix_misses": int(cache.get("misses", 0)),
            "spec_drafted": int(stats.get("spec_drafted", 0)), "spec_accepted": int(stats.get("spec_accepted", 0))}


class ServerState:
    def __init__(self, config: ServeConfig, keys: ApiKeys | None = None, models: Models | None = None) -> None:
        """``models``: the served models (default: on a ResidencyManager of ``config.memory`` with the runtime's
        loaders)."""
        self.config = config
        self.keys = keys if keys is not None else load_keys(config.api_keys_file)
        self.models = models if models is not None else Models(config)
        self.metrics = ServerMetrics(queue_depth=self._queue_depth, slots_busy=self._slots_busy,
                                     resident=self.models.resident, memory=self.models.manager.stats,
                                     caches=self._cache_counts, speculation=self._spec_counts)
        f = config.filters
        filters: list[Any] = [SizeLimit(f.max_chars)]
        if f.blocklist:
            filters.append(Blocklist(f.blocklist))
        if f.regex:
            filters.append(RegexFilter(f.regex))
        self.filters = FilterChain(filters)
        limits = config.limits
        self.cache = ResultCache(limits.result_cache, limits.result_cache_ttl_s) if limits.result_cache > 0 else None
        self.canaries = {r.model: CanaryRouter(r.model, r.canary, r.fraction, margin_error=r.margin_error,
                                               margin_p95=r.margin_p95, min_requests=r.min_requests)
                         for r in config.canary}
        self.ready = threading.Event()
        self._prepared = False
        self.failed: str | None = None  # why start-up failed (readyz says it)
        self._engines: dict[int, _Served] = {}  # id(loaded LLM) -> the LLM, weakly, and its served name
        self._gone: dict[str, dict[str, int]] = {}  # served name -> the counters of its engines already freed
        self._batchers: dict[str, tuple[Any, Any]] = {}  # name -> (loaded classifier, its DynamicBatcher)
        self._lock = threading.Lock()
        self.stopping = threading.Event()  # shutting down: the answers still running are being stopped
        self._running: set[Any] = set()  # engine handles of the answers in flight

    def prepare(self) -> None:
        """Resolve and plan every configured model (nothing is loaded): a bad ref or a model that cannot fit is
        one line here, before the server listens. A canary that cannot be planned is rolled back instead, and
        its stable version serves."""
        if self._prepared:
            return
        canaries = {router.canary: router for router in self.canaries.values()}
        for entry in self.config.models:
            try:
                self.models.add(entry)
            except EdgerunError as exc:
                if entry.name not in canaries:
                    raise
                self.models.unavailable[entry.name] = one_line(exc)
                canaries[entry.name].rollback(f"{entry.name} could not be planned: {one_line(exc)}")
        self._prepared = True

    def start(self) -> None:
        """:meth:`prepare`, then load the pinned models and the default one: ready when that is done."""
        try:
            self.prepare()
            self.models.load_pinned()
        except EdgerunError as exc:
            self.failed = one_line(exc)
            log.error("start-up failed: %s", self.failed)
            raise
        self.ready.set()

    def service(self, name: str, model: Any) -> Any:
        """The request surface of the loaded LLM ``model`` served as ``name``. ``model`` is noted weakly for
        /metrics: the caller's lease keeps it alive, the residency manager frees it."""
        with self._lock:
            self._prune()
            known = self._engines.get(id(model))
            if known is None or known.ref() is not model:
                self._engines[id(model)] = _Served(weakref.ref(model), name)
        return EngineService(model)

    def batcher(self, name: str, model: Any, make: Any) -> Any:
        """The classify batcher of the loaded classifier ``model`` (``make()`` on first use; a reloaded model
        gets a new one, the old one is closed)."""
        with self._lock:
            known = self._batchers.get(name)
            if known is None or known[0] is not model:
                if known is not None:
                    known[1].close()
                known = self._batchers[name] = (model, make())
            return known[1]

    def _prune(self) -> None:
        """Forget the engines that have been freed, keeping their last counters under their name (lock held)."""
        for key in [key for key, served in self._engines.items() if served.ref() is None]:
            served = self._engines.pop(key)
            gone = self._gone.setdefault(served.name, dict.fromkeys(COUNTERS, 0))
            for counter, n in served.counts.items():
                gone[counter] += n

    def _llm_stats(self) -> dict[str, dict[str, Any]]:
        """Per served name: ``queued`` (per priority) and ``slots_busy`` over its engines alive now (an old version
        still answering included), and the COUNTERS over every engine it has had."""
        with self._lock:
            self._prune()
            live = [(served, model) for served in self._engines.values() if (model := served.ref()) is not None]
        readings = [(served, model.stats()) for served, model in live]  # outside the lock: an engine takes its own
        del live
        out: dict[str, dict[str, Any]] = {}
        for served, stats in readings:
            row = out.setdefault(served.name, {"queued": {}, "slots_busy": 0})
            queued = stats.get("queued", {})
            for priority, n in (queued if isinstance(queued, dict) else {"interactive": queued}).items():
                row["queued"][priority] = row["queued"].get(priority, 0) + int(n)
            row["slots_busy"] += int(stats.get("slots_busy", 0))
        with self._lock:
            for served, stats in readings:
                served.counts = _counters(stats)
            totals = {name: dict(counts) for name, counts in self._gone.items()}
            for served in self._engines.values():
                total = totals.setdefault(served.name, dict.fromkeys(COUNTERS, 0))
                for counter, n in served.counts.items():
                    total[counter] += n
        for name, counts in totals.items():
            out.setdefault(name, {"queued": {}, "slots_busy": 0}).update(counts)
        return out

    def _cache_counts(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        if self.cache is not None:
            out["result"] = self.cache.stats()
        stats = self._llm_stats().values()
        out["prefix"] = {"hits": sum(s["prefix_hits"] for s in stats), "misses": sum(s["prefix_misses"] for s in stats)}
        return out

    def _spec_counts(self) -> dict[str, dict[str, int]]:
        """Speculative decoding per served name: draft tokens verified and accepted (the engines' counts)."""
        return {name: {"drafted": stats["spec_drafted"], "accepted": stats["spec_accepted"]}
                for name, stats in self._llm_stats().items()}

    def _queue_depth(self) -> dict[str, dict[str, int]]:
        return {name: stats["queued"] for name, stats in self._llm_stats().items()}

    def _slots_busy(self) -> dict[str, int]:
        return {name: stats["slots_busy"] for name, stats in self._llm_stats().items()}

    def track(self, handle: Any, running: bool) -> None:
        """Note an answer's engine handle as in flight (``running``) or ended."""
        with self._lock:
            (self._running.add if running else self._running.discard)(handle)

    def stop_generations(self) -> None:
        """Shutdown: stop every answer still running (each ends as a 503 / a stream's error event) and take no
        new ones."""
        self.stopping.set()
        with self._lock:
            handles = list(self._running)
        for handle in handles:
            handle.cancel()

    def close(self) -> None:
        self.ready.clear()
        with self._lock:
            batchers, self._batchers = list(self._batchers.values()), {}
        for _, batcher in batchers:
            batcher.close()
        self.models.close()
