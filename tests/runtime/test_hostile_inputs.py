"""Hostile images and WAVs through `edgerun run` in a child process: one line and exit 2, or a result where the
file is odd but valid; never a traceback or a hang (docs/trust.md, "Audio"; tests/runtime/hostile_cli.py).

The bundles use the null backend (runtime/backends/null.py), so what is tested is the reading of the input, with no
native runtime in the way: a vision bundle of 8 px RGB and an audio bundle of 0.1 s windows at 16 kHz.
"""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest

from runtime.backends.base import TensorInfo
from runtime.backends.null import NullBackend
from tests.runtime.hostile_cli import assert_ran, assert_refused, bundle_around, edgerun_child

RATE, WINDOW = 16_000, 1600


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for kind, shape, section in (("vision", (-1, 8, 8, 3), {"size": 8, "layout": "nhwc", "resize": "stretch", "output_is_logits": True}),
                                 ("audio", (-1, WINDOW), {"sample_rate": RATE, "frontend": "waveform", "input_shape": [WINDOW],
                                                          "output_is_logits": True})):
        folder = tmp_path_factory.mktemp(kind)
        (folder / "model.null").write_bytes(NullBackend.describe(TensorInfo("x", shape, "float32"), TensorInfo("y", (-1, 3), "float32")))
        out[kind] = bundle_around(folder, folder / "model.null", section, kind=kind, labels=3)
    return out


def _png(mode: str, size: tuple[int, int] = (9, 7), fmt: str = "PNG") -> bytes:
    """An image of ``mode`` saved as ``fmt``, its pixels noise (so that a cut file is cut inside its pixel data)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    w, h = size
    if mode == "I;16":
        img = Image.fromarray(rng.integers(0, 65536, (h, w), dtype=np.uint16))  # Pillow names 2-D uint16 I;16
    else:
        img = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).convert(mode)
    buf = io.BytesIO()
    img.save(buf, fmt)
    return buf.getvalue()


BAD_IMAGES = [
    ("empty", lambda: b""),
    ("garbage", lambda: bytes(range(256)) * 4),
    ("png-signature-only", lambda: b"\x89PNG\r\n\x1a\n"),
    ("png-cut-in-half", lambda: _png("RGB", (64, 64))[:200]),  # the header decodes; the pixels do not
    ("jpeg-cut-in-half", lambda: _png("RGB", (64, 64), "JPEG")[:300]),
    ("a-wav-named-png", lambda: b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(28)),
]


@pytest.mark.parametrize("case, make", BAD_IMAGES, ids=[c[0] for c in BAD_IMAGES])
def test_a_damaged_image_is_one_line(bundles: dict[str, Path], tmp_path: Path, case: str, make) -> None:
    path = tmp_path / "in.png"
    path.write_bytes(make())
    assert_refused(edgerun_child("run", bundles["vision"], "--input", path, "--json"), 2, str(path))


@pytest.mark.parametrize("mode, fmt", [("RGB", "PNG"), ("L", "PNG"), ("LA", "PNG"), ("RGBA", "PNG"), ("P", "GIF"), ("I;16", "PNG"),
                                       ("CMYK", "JPEG")])
def test_odd_but_valid_images_are_classified(bundles: dict[str, Path], tmp_path: Path, mode: str, fmt: str) -> None:
    # every mode Pillow converts to RGB is an image a user may have: each gets its labels, 1x1 pixel included
    paths = [tmp_path / f"in.{fmt.lower()}", tmp_path / f"tiny.{fmt.lower()}"]
    paths[0].write_bytes(_png(mode, fmt=fmt))
    paths[1].write_bytes(_png(mode, (1, 1), fmt))
    assert len(assert_ran(edgerun_child("run", bundles["vision"], "--input", *paths, "--json"))) == 2


def _wav(*, tag: int = 1, channels: int = 1, rate: int = RATE, bits: int = 16, frames: int = 4000,
         data_size: int | None = None, fmt_size: int | None = None, junk_chunks: int = 0) -> bytes:
    align = channels * max(bits, 8) // 8  # the header's fields as a writer would fill them, wrapped to their widths
    fmt = struct.pack("<HHIIHH", tag, channels, rate, rate * align & 0xFFFFFFFF, align & 0xFFFF, bits)
    data = bytes(frames * channels * max((bits + 7) // 8, 1))
    junk = (b"junk" + struct.pack("<I", 2) + b"..") * junk_chunks
    body = (b"WAVE" + junk + b"fmt " + struct.pack("<I", len(fmt) if fmt_size is None else fmt_size) + fmt
            + b"data" + struct.pack("<I", len(data) if data_size is None else data_size) + data)
    return b"RIFF" + struct.pack("<I", len(body)) + body


BAD_WAVS = [
    ("rate-2^32-1", dict(rate=0xFFFFFFFF), "sample rate 4294967295 Hz is not valid (1000..384000)"),
    ("rate-0", dict(rate=0), "sample rate 0 Hz is not valid"),
    ("zero-channels", dict(channels=0), "says 0 channels (at least 1)"),
    ("65535-channels-few-bytes", dict(channels=65535, frames=0), "holds no samples"),
    ("zero-bits", dict(bits=0), "0-bit samples are not supported"),
    ("64-bit", dict(bits=64), "64-bit samples are not supported"),
    ("ieee-float", dict(tag=3, bits=32), "IEEE float"),
    ("fmt-chunk-claims-4-GiB", dict(fmt_size=0xFFFFFFF0), "past the end"),
    ("2000-chunks-before-fmt", dict(junk_chunks=2000), "more than 1024 chunks"),
    ("601-seconds", dict(rate=1000, bits=8, frames=601_000), "601 s of audio is longer than the 600 s"),
    ("no-samples", dict(frames=0), "holds no samples"),
]


@pytest.mark.parametrize("case, kwargs, needle", BAD_WAVS, ids=[c[0] for c in BAD_WAVS])
def test_a_hostile_wav_is_one_line(bundles: dict[str, Path], tmp_path: Path, case: str, kwargs: dict, needle: str) -> None:
    path = tmp_path / "in.wav"
    path.write_bytes(_wav(**kwargs))
    assert_refused(edgerun_child("run", bundles["audio"], "--input", path, "--json"), 2, str(path), needle)


@pytest.mark.parametrize("cut", [4, 12, 20, 30, 44])  # inside RIFF, after WAVE, inside fmt, after fmt, after data's header
def test_a_wav_cut_anywhere_in_its_header_is_one_line(bundles: dict[str, Path], tmp_path: Path, cut: int) -> None:
    path = tmp_path / "in.wav"
    path.write_bytes(_wav()[:cut])
    assert_refused(edgerun_child("run", bundles["audio"], "--input", path, "--json"), 2, str(path))


def test_a_data_size_past_the_end_reads_what_is_there(bundles: dict[str, Path], tmp_path: Path) -> None:
    # a streaming writer's 0xFFFFFFFF (or an interrupted recording): the whole frames present are read, nothing more
    # is allocated, and the result says how long the clip really is
    path = tmp_path / "in.wav"
    path.write_bytes(_wav(data_size=0xFFFFFFFF, frames=8000))
    (pred,) = assert_ran(edgerun_child("run", bundles["audio"], "--input", path, "--json"))
    assert pred["seconds"] == 0.5


def test_an_odd_rate_and_many_channels_are_resampled_and_mixed(bundles: dict[str, Path], tmp_path: Path) -> None:
    # 7 channels of 24-bit at 383,999 Hz (a prime: no common factor with 16 kHz) for a quarter of a second
    path = tmp_path / "in.wav"
    path.write_bytes(_wav(channels=7, rate=383_999, bits=24, frames=96_000))
    (pred,) = assert_ran(edgerun_child("run", bundles["audio"], "--input", path, "--json"))
    assert pred["resampled_from"] == 383_999 and pred["seconds"] == pytest.approx(0.25, abs=1e-3)
