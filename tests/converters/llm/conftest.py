"""Tiny random checkpoints, built once per session (about a second each on 2 cores)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.converters.llm.tiny import SPECS, TinySpec, build_checkpoint


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny-checkpoints")
    for spec in SPECS:
        build_checkpoint(spec, root / spec.id)
    return root


@pytest.fixture
def tiny_copy(tiny_root: Path, tmp_path: Path):
    """A private, editable copy of a tiny checkpoint: ``tiny_copy("qwen2") -> Path``."""

    def make(spec_id: str = "llama-smollm") -> Path:
        dst = tmp_path / f"ckpt-{spec_id}"
        shutil.copytree(tiny_root / spec_id, dst)
        return dst

    return make


def spec(spec_id: str) -> TinySpec:
    return next(s for s in SPECS if s.id == spec_id)
