"""Session fixtures of the server tests: one real `edgerun serve` over the default model, loaded once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.server.config import Limits, ModelEntry, ServeConfig
from tests.apps.serve_harness import LiveServer

SERVE_CTX = 512  # tokens per slot: small, so a too-long prompt is cheap to make


@pytest.fixture(scope="session")
def llm_server(smollm, shared_home: Path) -> Iterator[LiveServer]:
    """The default model served as "default" on a random loopback port: 2 slots, at most 2 queued per class."""
    with pytest.MonkeyPatch.context() as mp:  # the server thread resolves models in the session's store
        mp.setenv("EDGERUN_HOME", str(shared_home))
        cfg = ServeConfig(slots=2, models=[ModelEntry("default", "default", pinned=True, options={"ctx": SERVE_CTX})],
                          limits=Limits(max_queued=2, result_cache=1 << 20))
        server = LiveServer(cfg)
        server.wait_ready()
        yield server
        server.stop()
