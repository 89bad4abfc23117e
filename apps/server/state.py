"""Everything one server process holds: its config, keys, models, caches, metrics, filters and canary routers.

Built once by ``edgerun serve`` (or a test) and handed to :func:`apps.server.app.create_app`; the handlers read it
and keep nothing of their own.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from apps.server.canary import CanaryRouter
from apps.server.config import ServeConfig
from apps.server.llm_service import EngineService
from apps.server.metrics import ServerMetrics
from apps.server.models import Models
from apps.server.security import ApiKeys, load_keys
from runtime.errors import EdgerunError, one_line
from runtime.result_cache import ResultCache
from runtime.safety import Blocklist, FilterChain, RegexFilter, SizeLimit

log = logging.getLogger(__name__)


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
        self._services: dict[int, tuple[Any, Any, str]] = {}  # id(loaded model) -> (model, its service, its name)
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
        """The request surface of the loaded LLM ``model`` served as ``name`` (one per loaded object)."""
        with self._lock:
            known = self._services.get(id(model))
            if known is None or known[0] is not model:
                known = self._services[id(model)] = (model, EngineService(model), name)
            return known[1]

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

    def _llm_stats(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            services = [(name, svc) for _, svc, name in self._services.values()]
        return {name: svc.stats() for name, svc in services}

    def _cache_counts(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        if self.cache is not None:
            out["result"] = self.cache.stats()
        prefix = {"hits": 0, "misses": 0}
        for stats in self._llm_stats().values():
            cache = stats.get("prefix_cache", {})
            for kind in prefix:
                prefix[kind] += int(cache.get(kind, 0))
        out["prefix"] = prefix
        return out

    def _spec_counts(self) -> dict[str, dict[str, int]]:
        """Speculative decoding per served name: draft tokens verified and accepted (the engines' counts)."""
        return {name: {"drafted": int(stats.get("spec_drafted", 0)), "accepted": int(stats.get("spec_accepted", 0))}
                for name, stats in self._llm_stats().items()}

    def _queue_depth(self) -> dict[str, dict[str, int]]:
        out = {}
        for name, stats in self._llm_stats().items():
            queued = stats.get("queued", {})
            out[name] = queued if isinstance(queued, dict) else {"interactive": queued}
        return out

    def _slots_busy(self) -> dict[str, int]:
        return {name: int(stats.get("slots_busy", 0)) for name, stats in self._llm_stats().items()}

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
