"""runtime.classify.preprocess.load_rgb's bounds: the pixels a decode may produce are checked from the header before any is
decoded, and an image is decoded at no more than the model needs (a JPEG at 1/2..1/8 scale, others reduced)."""

from __future__ import annotations

import io
import struct
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from runtime.bundle.manifest import ResizeMode
from runtime.classify.preprocess import DECODE_BYTES_PER_PIXEL, ImageTooLarge, decode_bytes, load_rgb, needed_side, resize_rgb
from runtime.errors import BadInput

Image = pytest.importorskip("PIL.Image")  # the vision extra; the server's classify needs it too

LIMIT = 4 << 20


def black_png(width: int, height: int) -> bytes:
    """An 8-bit grey PNG of ``width`` x ``height`` black pixels, made row by row: the test never holds its pixels
    (an 8192x8192 one is ~65 KB of file and 64 MiB decoded)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    z = zlib.compressobj(9)
    row = bytes(width + 1)  # filter byte 0, then the row
    idat = b"".join(z.compress(row) for _ in range(height)) + z.flush()
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def jpeg_claiming(width: int, height: int) -> bytes:
    """A small real JPEG whose frame header (SOF0) is rewritten to claim ``width`` x ``height``: only a decoder
    that trusts the header before checking it would try to allocate that much."""
    out = io.BytesIO()
    Image.new("L", (16, 16)).save(out, "JPEG")
    data = bytearray(out.getvalue())
    at = data.index(b"\xff\xc0")
    data[at + 5:at + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def gradient_jpeg(path: Path, width: int, height: int) -> np.ndarray:
    x = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None, None]
    rgb = np.concatenate([np.broadcast_to(x, (height, width, 1)), np.broadcast_to(y, (height, width, 1)),
                          np.broadcast_to((x + y) / 2, (height, width, 1))], axis=2).astype(np.uint8)
    Image.fromarray(rgb).save(path, "JPEG", quality=95)
    return rgb


def test_a_huge_png_is_refused_from_its_header_naming_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "bomb.png"
    path.write_bytes(black_png(8192, 8192))  # 64 Mpx: the old bound (64 << 20) let it decode, ~450 MiB at its peak
    t0 = time.monotonic()
    with pytest.raises(ImageTooLarge, match=f"8192x8192 pixels is too large to decode: at most {LIMIT} pixels"):
        load_rgb(path, need=224, max_pixels=LIMIT)
    assert time.monotonic() - t0 < 5  # the header only: no 64 Mpx decode (which takes seconds here)


def test_past_pillows_own_bomb_bound_is_image_too_large_too(tmp_path: Path) -> None:
    path = tmp_path / "huge.jpg"
    path.write_bytes(jpeg_claiming(30000, 30000))  # Pillow refuses 900 Mpx itself (DecompressionBombError)
    with pytest.raises(ImageTooLarge, match=f"too large to decode \\(at most {LIMIT} pixels\\)"):
        load_rgb(path, need=8, max_pixels=LIMIT)


def test_a_jpeg_that_is_too_large_even_at_one_eighth_names_the_scaled_size(tmp_path: Path) -> None:
    path = tmp_path / "big.jpg"
    path.write_bytes(jpeg_claiming(9000, 9000))
    with pytest.raises(ImageTooLarge, match="9000x9000 pixels \\(still 2250x2250 at the smallest JPEG scale\\)"):
        load_rgb(path, need=2000, max_pixels=LIMIT)  # 9000 // 2000: 1/4 at most keeps 2000 pixels a side


def test_a_big_jpeg_decodes_at_a_reduced_scale_close_to_the_full_decode(tmp_path: Path) -> None:
    path = tmp_path / "photo.jpg"
    gradient_jpeg(path, 4096, 3072)  # 12.6 Mpx: over the pixel bound, unless decoded at a reduced scale
    spec = type("Spec", (), {"size": 64, "resize": ResizeMode.CENTER_CROP, "crop_fraction": 0.875})()
    need = needed_side(spec)  # 73
    small = load_rgb(path, need=need, max_pixels=LIMIT)
    assert need <= min(small.shape[:2]) < 2 * need and small.shape[2] == 3
    full = load_rgb(path)  # every pixel, as the command line decodes it
    # What the model sees from either: the smooth gradient within a few levels (DCT scaling and box filter vs bilinear).
    diff = np.abs(resize_rgb(small, spec).astype(int) - resize_rgb(full, spec).astype(int))
    assert diff.mean() < 2.0 and diff.max() <= 12, (diff.mean(), diff.max())


@pytest.mark.parametrize("mode", ["RGBA", "P", "L", "I;16"])  # reduce takes some modes as they are; others convert first
def test_other_formats_are_reduced_after_their_decode(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "wide.png"
    flat = Image.new("RGB", (1000, 600), (200, 40, 90))
    # an adaptive palette keeps a flat image flat (the default web palette dithers it)
    (flat.convert("P", palette=Image.Palette.ADAPTIVE) if mode == "P" else flat.convert(mode)).save(path)
    out = load_rgb(path, need=100, max_pixels=LIMIT)
    assert out.shape == (100, 167, 3) and out.dtype == np.uint8  # 1000x600 reduced by 6 (rounded up)
    assert np.array_equal(out[50, 50], load_rgb(path)[300, 300])  # a flat color stays the same color


def test_a_small_image_and_no_need_decode_every_pixel(tmp_path: Path) -> None:
    path = tmp_path / "digit.png"
    Image.new("RGB", (8, 8), (1, 2, 3)).save(path)
    assert load_rgb(path, need=8).shape == (8, 8, 3) == load_rgb(path).shape
    with pytest.raises(ImageTooLarge, match="8x8 pixels is too large to decode: at most 63 pixels"):
        load_rgb(path, max_pixels=63)
    path.write_bytes(b"not an image")
    with pytest.raises(BadInput, match="cannot decode as an image") as err:
        load_rgb(path, need=8)
    assert not isinstance(err.value, ImageTooLarge)


def test_decode_bytes_is_the_per_pixel_peak_times_the_bound() -> None:
    assert decode_bytes(LIMIT) == LIMIT * DECODE_BYTES_PER_PIXEL == 40 << 20
