"""POST /v1/classify holds under hostile images: a body is decoded only with a place (a free decode slot, room in
its queue), at no more pixels than the model needs, and a decode that would pass limits.max_image_pixels is a 413
from the header alone. The server's peak memory is read from the kernel (VmHWM, reset before each request)."""

from __future__ import annotations

import io
import json
import re
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.server.classify import decode_slots
from apps.server.config import Limits, ModelEntry, ServeConfig
from apps.server.models import spec_of
from runtime.classify.preprocess import decode_bytes
from runtime.residency.loaders import DECODE_TERM, VisionLoader
from runtime.residency.manager import ResidencyManager
from tests.apps.serve_harness import LiveServer
from tests.converters.vision.conftest import session_bundles, session_digits
from tests.converters.vision.digits import Digits
from tests.runtime.test_preprocess_bounds import black_png, jpeg_claiming

pytestmark = pytest.mark.slow

PIXELS = 4 << 20  # limits.max_image_pixels: the default
MIB = 1 << 20
# What one request may add to the process's peak: the old code's 8192x8192 decode added ~450 MiB; within the bound
# a decode holds 40 MiB at most (runtime.classify.preprocess.decode_bytes), the 8 MiB body and its copies a few more.
PEAK_MIB = 64


class Peak:
    """The growth of this process's peak resident memory (the server runs in it) across a block, from the kernel:
    VmHWM reset through /proc/self/clear_refs (Linux 4.0+)."""

    def __enter__(self) -> Peak:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        self.start = self._read("VmHWM")
        return self

    def __exit__(self, *exc: object) -> None:
        self.mib = (self._read("VmHWM") - self.start) / 1024

    @staticmethod
    def _read(field: str) -> int:
        with open("/proc/self/status") as fh:
            return int(re.search(rf"{field}:\s+([0-9]+) kB", fh.read()).group(1))


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Digits:
    return session_digits(tmp_path_factory)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return session_bundles(tmp_path_factory)["tflite"]


@pytest.fixture(scope="module")
def server(bundle: Path) -> Iterator[LiveServer]:
    cfg = ServeConfig(models=[ModelEntry("digits", str(bundle), pinned=True)],
                      limits=Limits(max_body_bytes=8 * MIB, decode_slots=1, classify_wait_ms=0))
    live = LiveServer(cfg)
    live.wait_ready()
    yield live
    live.stop()


def _classify(server: LiveServer, body: bytes, kind: str = "image/png", query: str = "model=digits&top=3",
              headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], dict]:
    status, hdrs, raw = server.request("POST", f"/v1/classify?{query}", body, {"Content-Type": kind, **(headers or {})},
                                       timeout=60)
    return status, hdrs, json.loads(raw)


def test_a_huge_png_is_413_from_its_header_quickly_in_bounded_memory(server: LiveServer) -> None:
    body = black_png(8192, 8192)  # 64 Mpx in ~65 KB: 64 MiB decoded as grey, ~450 MiB at the old decode's peak
    t0 = time.monotonic()
    with Peak() as peak:
        status, _, answer = _classify(server, body)
    message = answer["error"]["message"]
    assert status == 413 and answer["error"]["code"] == "request_too_large", answer
    assert message == (f"the request body: 8192x8192 pixels is too large to decode: at most {PIXELS} pixels "
                       "(limits.max_image_pixels)")
    assert time.monotonic() - t0 < 10 and peak.mib < PEAK_MIB, (time.monotonic() - t0, peak.mib)


def test_a_huge_jpeg_is_decoded_at_one_eighth_and_classified_in_bounded_memory(server: LiveServer) -> None:
    from PIL import Image

    out = io.BytesIO()
    Image.new("L", (8192, 8192), 40).save(out, "JPEG", quality=50)  # 64 Mpx; at 1/8 scale 1024x1024
    body = out.getvalue()
    with Peak() as peak:
        status, _, answer = _classify(server, body, "image/jpeg")
    assert status == 200 and len(answer["labels"]) == 3, answer
    assert peak.mib < PEAK_MIB, peak.mib  # the old code decoded every pixel: ~450 MiB


def test_a_jpeg_too_large_at_any_scale_is_413_naming_the_limit(server: LiveServer) -> None:
    status, _, answer = _classify(server, jpeg_claiming(30000, 30000), "image/jpeg")
    assert status == 413 and f"too large to decode (at most {PIXELS} pixels" in answer["error"]["message"], answer
    assert "(limits.max_image_pixels)" in answer["error"]["message"]


def test_busy_decode_slots_are_429_with_retry_after(server: LiveServer, digits: Digits) -> None:
    body = digits.test_images[0].read_bytes()
    with decode_slots(server.state).hold():  # the server's one slot, held as a decode in progress would hold it
        status, headers, answer = _classify(server, body)
    assert status == 429 and headers["retry-after"] == "1" and answer["error"]["code"] == "queue_full", answer
    assert "decode slots are busy (limits.decode_slots)" in answer["error"]["message"]
    assert _classify(server, body)[0] == 200  # the slot is free again


@pytest.mark.parametrize("top", ["\u00b2", "\u0663", "1\u00b2"])  # "²": isdigit() but int() fails; "٣": int() gives 3
def test_top_in_other_digits_is_400(server: LiveServer, digits: Digits, top: str) -> None:
    query = "model=digits&top=" + urllib.parse.quote(top)
    status, _, answer = _classify(server, digits.test_images[0].read_bytes(), query=query)
    assert status == 400 and answer["error"]["message"].startswith("top ") and "from 1 to 1000" in answer["error"]["message"]


def test_the_memory_plan_holds_the_decode_slots_once(server: LiveServer, bundle: Path) -> None:
    loader = VisionLoader()
    plain = spec_of(ModelEntry("a", str(bundle)), "vision", 4, 8)
    own = loader.plan_bytes(plain, 1 << 30)
    # the live server: its one decode slot is in its vision model's plan
    assert server.state.models.manager.planned_bytes("digits") == own + decode_bytes(PIXELS)
    slots = 3 * decode_bytes(PIXELS)
    specs = [spec_of(ModelEntry(name, str(bundle)), "vision", 4, 8, decode_bytes=slots) for name in ("a", "b")]
    assert loader.plan_bytes(specs[0], 1 << 30) == own + slots and loader.shared_bytes(specs[0])[DECODE_TERM] == slots
    assert DECODE_TERM not in loader.shared_bytes(plain)
    # two vision models on one server share its decode slots: counted once, like a library
    runtime = sum(v for k, v in loader.shared_bytes(plain).items())
    with ResidencyManager(1 << 30, loaders={"vision": loader}) as manager:
        for spec in specs:
            manager.add(spec)
        with manager.acquire("a"), manager.acquire("b"):
            assert manager.used_bytes() == 2 * (own - runtime) + runtime + slots
