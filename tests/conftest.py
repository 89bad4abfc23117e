"""Shared fixtures: an isolated model store per test session, tiny GGUF files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runtime.bundle.store import Store


@pytest.fixture(scope="session")
def shared_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store that the real packaged models are built into once per session."""
    home = tmp_path_factory.mktemp("edgerun-home")
    return home


@pytest.fixture(autouse=True)
def _isolated_home(shared_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGERUN_HOME", str(shared_home))


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    """An empty store of the test's own."""
    root = tmp_path / "store"
    monkeypatch.setenv("EDGERUN_HOME", str(root))
    return Store(root)


@pytest.fixture(scope="session")
def smollm(shared_home: Path):
    """The default model (SmolLM2-135M-Instruct Q4_1), built from its package once."""
    from runtime.bundle.resolve import resolve

    return resolve("default", Store(shared_home))


@pytest.fixture(scope="session")
def gemma(shared_home: Path):
    from runtime.bundle.resolve import resolve

    return resolve("gemma3-270m", Store(shared_home))


def pytest_configure(config: pytest.Config) -> None:
    # Keep llama.cpp from spinning more threads than the test machine has.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
