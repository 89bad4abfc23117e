"""The server keeps no LLM that the residency manager has unloaded: two unpinned models under a budget that fits one
of them, asked in turn 50 times, leave exactly one engine alive, the process's RSS flat, and /metrics' prefix-cache
counters still counting (an unloaded engine's counts are kept, never lost or taken back)."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import pytest

from apps.server.config import Limits, ModelEntry, ServeConfig
from apps.server.models import Models
from runtime.residency.loaders import default_loaders
from runtime.residency.manager import ModelSpec, ResidencyManager, share_for
from tests.apps.serve_harness import LiveServer

pytestmark = pytest.mark.slow
SWAPS = 50
OPTIONS = {"ctx": 512, "slots": 1}
NO_STORE = {"Cache-Control": "no-store"}
# About 300 tokens: each engine's prefix cache keeps the prompt's KV cells (SmolLM2: ~23 KB a token, ~7 MB), which
# a server that held every engine it served kept alive after the unload.
PROMPT = " ".join(f"Item {i} is a {('red', 'green', 'blue')[i % 3]} box." for i in range(40)) + " The last item is"
# RSS allowed to grow over the last 25 swaps. Measured here: the first ~30 swaps grow RSS by ~110 MiB in 10 MiB
# steps as the allocator's arenas settle, then it is flat (+11 MiB from swap 25 to 50). An engine kept alive keeps
# at least its prefix cache's ~7 MiB: 25 of them would be 175 MiB.
GROWTH_MIB = 32


class _Recorder:
    """The runtime's LLM loader, noting a weak reference to every engine it loads."""

    def __init__(self) -> None:
        self.real = default_loaders()["llm"]
        self.loaded: list[weakref.ref] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def load(self, spec: Any, budget: int) -> Any:
        obj = self.real.load(spec, budget)
        self.loaded.append(weakref.ref(obj))
        return obj


def _budget_for_one() -> int:
    """A budget that holds one of the two models but not both (each model's plan grows with the budget by its
    prefix cache, 1/16 of it: the plans are read at the budget chosen)."""
    loader = default_loaders()["llm"]
    spec = ModelSpec("a", "default", "llm", options=OPTIONS)
    budget = 1 << 30
    for _ in range(20):  # to a fixed point: the smallest budget one plan fits, at that budget
        planned = loader.plan_bytes(spec, budget)
        fits = share_for(planned)
        if fits == budget:
            break
        budget = fits
    budget += 1 << 20  # a little over the fixed point, still far below two
    planned, runtime = loader.plan_bytes(spec, budget), sum(loader.shared_bytes(spec).values())
    two = 2 * planned - runtime  # the runtime libraries are counted once
    assert share_for(planned) <= budget < share_for(two), (planned, runtime, budget)
    return budget


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_alternating_unpinned_llms_frees_each_unloaded_engine(smollm, shared_home: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGERUN_HOME", str(shared_home))
    budget = _budget_for_one()
    recorder = _Recorder()
    cfg = ServeConfig(memory=budget, slots=1, speculate=False, limits=Limits(result_cache=0),
                      models=[ModelEntry("a", "default", options=OPTIONS), ModelEntry("b", "default", options=OPTIONS)])
    manager = ResidencyManager(budget, loaders={**default_loaders(), "llm": recorder})
    server = LiveServer(cfg, models=Models(cfg, manager))
    try:
        server.wait_ready()  # "a", the default model, is loaded
        rss: list[int] = []
        misses: list[float] = []
        for i in range(SWAPS):
            name = "ab"[(i + 1) % 2]  # b, a, b, ...: each request makes the other model go
            status, _, body = server.request("POST", "/v1/completions", {"model": name, "prompt": PROMPT, "max_tokens": 1,
                                                                          "temperature": 0}, NO_STORE)
            assert status == 200, body[:300]
            misses.append(server.metric("edgerun_cache_misses_total", cache="prefix") or 0.0)
            gc.collect()
            rss.append(_rss_bytes())
        assert manager.stats()["evictions"] == SWAPS  # the budget held one model at a time
        assert len(recorder.loaded) == SWAPS + 1
        gc.collect()
        alive = [ref for ref in recorder.loaded if ref() is not None]
        assert len(alive) == 1, f"{len(alive)} of {len(recorder.loaded)} engines are still referenced after unloading"
        growth = rss[-1] - rss[SWAPS // 2 - 1]
        assert growth < GROWTH_MIB << 20, f"RSS grew {growth / 2**20:.0f} MiB over the last {SWAPS // 2} swaps: {rss}"
        assert misses == sorted(misses) and misses[-1] >= SWAPS  # a fresh engine misses once; none forgotten
    finally:
        server.stop()
