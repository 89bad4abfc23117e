"""POST /v1/classify through a real server: the digits vision bundle (tests/converters/vision), batched by
runtime.serving.batcher.DynamicBatcher."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from apps.server.config import Limits, ModelEntry, ServeConfig
from runtime.formats.wav import write_wav
from tests.apps.serve_harness import LiveServer
from tests.converters.vision.conftest import session_bundles, session_digits
from tests.converters.vision.digits import LABELS, Digits

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Digits:
    return session_digits(tmp_path_factory)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    bundle = session_bundles(tmp_path_factory)["tflite"]
    # a 300 ms batching window, so that requests sent together are classified together
    cfg = ServeConfig(models=[ModelEntry("digits", str(bundle), pinned=True)],
                      limits=Limits(classify_batch=8, classify_wait_ms=300))
    live = LiveServer(cfg)
    live.wait_ready()
    yield live
    live.stop()


def _classify(server: LiveServer, path: Path, query: str = "model=digits&top=3", kind: str = "image/png"):
    return server.request("POST", f"/v1/classify?{query}", path.read_bytes(), {"Content-Type": kind})


def test_images_in_labels_out_batched(server: LiveServer, digits: Digits) -> None:
    files, want = digits.test_images[:8], [LABELS[y] for y in digits.test_labels[:8]]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda p: _classify(server, p), files))
    assert all(status == 200 for status, _, _ in answers)
    labels = [json.loads(body)["labels"] for _, _, body in answers]
    assert all(len(lab) == 3 and lab[0]["score"] >= lab[1]["score"] >= lab[2]["score"] for lab in labels)
    assert sum(lab[0]["label"] == w for lab, w in zip(labels, want, strict=True)) >= 6  # ~95 % held-out accuracy
    stats = next(iter(server.state._batchers.values()))[1].stats()
    assert stats["items"] == 8 and stats["batches"] < 8  # requests sent together ran together


@pytest.mark.parametrize("query, kind, status, word", [
    ("model=digits", "text/plain", 400, "Content-Type"),
    ("model=digits", "audio/wav", 400, "cannot classify a WAV"),
    ("top=2", "image/png", 400, "model is missing"),
    ("model=digits&top=0", "image/png", 400, "top"),
    ("model=../digits", "image/png", 400, "model name"),
    ("model=other", "image/png", 404, "not served"),
])
def test_bad_classify_requests(server: LiveServer, digits: Digits, tmp_path: Path, query: str, kind: str,
                               status: int, word: str) -> None:
    path = digits.test_images[0]
    if kind == "audio/wav":
        path = tmp_path / "a.wav"
        write_wav(path, np.zeros(1600, np.float32), 16000)
    got, _, body = _classify(server, path, query, kind)
    assert got == status and word in json.loads(body)["error"]["message"], body


def test_undecodable_image_is_400_naming_the_body(server: LiveServer, tmp_path: Path) -> None:
    path = tmp_path / "x.png"
    path.write_bytes(b"not an image at all")
    status, _, body = _classify(server, path)
    message = json.loads(body)["error"]["message"]
    assert status == 400 and message.startswith("the request body: cannot decode") and str(tmp_path) not in message
