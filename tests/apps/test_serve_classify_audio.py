"""POST /v1/classify with a WAV body: openWakeWord's "alexa" head converted to an INT8 bundle (as
tests/converters/audio does), served; a held-out clip with the wake word is detected, one without is not."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.cli import main as edgerun
from apps.server.config import ModelEntry, ServeConfig
from tests.apps.serve_harness import LiveServer
from tests.converters.audio.speech import OTHER, WAKE, synthesize

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    root = tmp_path_factory.mktemp("speech")
    synthesize(root / "calib", WAKE[:4] + OTHER[:5], [0.85, 1.0, 1.2])
    wake = synthesize(root / "eval" / "alexa", WAKE[4:], [1.0], seed=1)
    other = synthesize(root / "eval" / "other", OTHER[5:], [1.0], seed=1)
    return {"root": [root], "wake": wake, "other": other}


@pytest.fixture(scope="module")
def server(clips: dict[str, list[Path]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = clips["root"][0]
    out = tmp_path_factory.mktemp("alexa") / "alexa-tflite-int8"
    assert edgerun(["convert", "audio", "zoo:openwakeword-alexa", "--calib", str(root / "calib"), "--eval",
                    str(root / "eval"), "--format", "tflite", "--quant", "int8", "--out", str(out)]) == 0
    live = LiveServer(ServeConfig(models=[ModelEntry("alexa", str(out), pinned=True)]))
    live.wait_ready()
    yield live
    live.stop()


def test_wav_in_detection_out(server: LiveServer, clips: dict[str, list[Path]]) -> None:
    for path, want in [(p, True) for p in clips["wake"]] + [(p, False) for p in clips["other"]]:
        status, _, body = server.request("POST", "/v1/classify?model=alexa", path.read_bytes(), {"Content-Type": "audio/wav"})
        assert status == 200, body
        answer = json.loads(body)
        assert answer["detected"] is want and answer["labels"][0]["label"] == "alexa", (path, answer)
        assert answer["resampled_from"] == 22050 and "input" not in answer
    status, _, body = server.request("POST", "/v1/classify?model=alexa", b"RIFF....WAVEjunk", {"Content-Type": "audio/wav"})
    assert status == 400 and "the request body" in json.loads(body)["error"]["message"]
