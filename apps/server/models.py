"""The served models by public name: what kind each is, and a lease on the loaded model while a request uses it.

Loading, eviction and the one memory plan are runtime.residency.ResidencyManager's; this module only turns the
serve config's [[models]] into its ModelSpecs and finds the kind of each model from its bundle.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

from apps.server.config import ModelEntry, ServeConfig
from runtime.errors import BadInput

log = logging.getLogger(__name__)


def kind_of(entry: ModelEntry) -> str:
    """The entry's kind ("llm", "vision", "audio"): as configured, else read from its bundle (resolving it builds a
    recipe on first use and installs a .edgerun file)."""
    if entry.kind:
        return entry.kind
    from runtime.resolve import resolve

    return resolve(entry.ref).manifest.kind.value


class StaticModels:
    """Every configured model loaded at start and kept (a build without runtime.residency)."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.kinds: dict[str, str] = {}
        self._loaded: dict[str, Any] = {}
        self._lock = threading.Lock()

    def add(self, entry: ModelEntry) -> None:
        self.kinds[entry.name] = kind_of(entry)

    def load_pinned(self) -> None:
        for entry in self.config.models:
            with self.acquire(entry.name):
                pass

    def _load(self, entry: ModelEntry) -> Any:
        kind, opts, memory = self.kinds[entry.name], entry.options, self.config.memory
        if kind == "llm":
            try:
                from runtime.engine import Engine
            except ImportError:
                from runtime.llm import LLM

                return LLM.load(entry.ref, memory=memory, ctx=opts.get("ctx"), threads=opts.get("threads"))
            return Engine.load(entry.ref, memory=memory, slots=opts.get("slots", self.config.slots), ctx=opts.get("ctx"),
                               threads=opts.get("threads"), max_queued=self.config.limits.max_queued)
        if kind == "vision":
            from runtime.classifier import Classifier

            return Classifier.load(entry.ref, threads=opts.get("threads"), memory=memory, batch=opts.get("batch", 1))
        if kind == "audio":
            from runtime.audio_classifier import AudioClassifier

            return AudioClassifier.load(entry.ref, threads=opts.get("threads"))
        raise BadInput(f"model {entry.name!r}: unknown kind {kind!r}")

    @contextlib.contextmanager
    def acquire(self, name: str) -> Iterator[Any]:
        with self._lock:
            if name not in self._loaded:
                entry = self.config.model(name)
                assert entry is not None
                self._loaded[name] = self._load(entry)
                log.info("loaded %s (%s)", name, entry.ref)
            model = self._loaded[name]
        yield model

    def resident(self) -> list[dict[str, Any]]:
        return [{"name": n, "kind": self.kinds[n]} for n in self._loaded]

    def close(self) -> None:
        with self._lock:
            for model in self._loaded.values():
                model.close()
            self._loaded.clear()
