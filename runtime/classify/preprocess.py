"""Images to model inputs and model outputs to labels, exactly as the bundle's manifest says.

The conversion step and the runtime both go through :func:`image_tensor`, so the
numbers a bundle was calibrated and measured on are the numbers it sees in use.
Pillow is the one image decoder; it is imported only when an image is decoded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from runtime.bundle.manifest import ColorOrder, Layout, ResizeMode, TensorQuant, VisionSpec
from runtime.errors import BadInput, missing
from runtime.files import open_regular

MAX_IMAGE_PIXELS = 64 << 20  # refuse decompression bombs before decoding
# What one load_rgb holds at its peak, per pixel the decoder produces: the decoded image (up to 4 bytes a pixel:
# RGBA, CMYK, 32-bit gray), its RGB conversion (3) and the bytes numpy's array is made from (3).
DECODE_BYTES_PER_PIXEL = 10
REDUCE_FROM = 2  # an image is reduced once both its sides are at least this many times what the model needs


class ImageTooLarge(BadInput):
    """An image whose decode would produce more pixels than allowed (the server answers HTTP 413)."""


def _pil():
    try:
        from PIL import Image
    except ModuleNotFoundError:
        raise missing("PIL", "vision") from None
    return Image


def decode_bytes(max_pixels: int) -> int:
    """The most one :func:`load_rgb` within ``max_pixels`` holds at once, in bytes."""
    return max_pixels * DECODE_BYTES_PER_PIXEL


def needed_side(spec: VisionSpec) -> int:
    """The shortest side, in pixels, that :func:`resize_rgb` scales an image to before it crops (or stretches)."""
    if spec.resize is ResizeMode.STRETCH:
        return spec.size
    return max(spec.size, round(spec.size / spec.crop_fraction))


def load_rgb(path: Path | str, *, need: int | None = None, max_pixels: int = MAX_IMAGE_PIXELS) -> np.ndarray:
    """Decode an image file to uint8 RGB, HxWx3. Undecodable files raise BadInput naming the file.

    ``max_pixels``: the most pixels the decoder may produce, checked from the header before any is decoded;
    more raises ImageTooLarge naming the limit. ``need`` (see :func:`needed_side`): the image only has to keep
    both sides at least this long, so a JPEG is decoded at 1/2, 1/4 or 1/8 scale (DCT scaling, ``Image.draft``)
    when that keeps them, which is what ``max_pixels`` is then checked against, and another format is reduced
    by a whole factor (a box filter, ``Image.reduce``) right after its decode. Without ``need`` every pixel is
    decoded, as the bundle's calibration saw them."""
    Image = _pil()
    path = Path(path)
    try:
        # open_regular: a missing path, a FIFO or a device is one line, and a FIFO swapped in after its stat() is
        # opened without blocking and refused by fstat() (a check-then-open by path would wait on it forever).
        with open_regular(path, "image file") as fh, Image.open(fh) as img:
            full = img.size
            if need is not None:
                img.draft("RGB", (need, need))  # JPEG only (a no-op elsewhere); img.size becomes the decoded size
            w, h = img.size
            if w * h > max_pixels:
                scaled = f" (still {w}x{h} at the smallest JPEG scale)" if (w, h) != full else ""
                raise ImageTooLarge(f"{path}: {full[0]}x{full[1]} pixels{scaled} is too large to decode: "
                                    f"at most {max_pixels} pixels")
            factor = min(w, h) // need if need is not None else 1
            if factor >= REDUCE_FROM:
                img.load()
                reduced = img.reduce(factor) if img.mode in ("L", "LA", "RGB", "RGBA") else img.convert("RGB").reduce(factor)
                return np.asarray(reduced.convert("RGB"), dtype=np.uint8)
            return np.asarray(img.convert("RGB"), dtype=np.uint8)
    except BadInput:
        raise
    except Exception as exc:  # PIL raises many types for damaged files (and DecompressionBombError past its own bound)
        too_large = type(exc).__name__ == "DecompressionBombError"
        kind = ImageTooLarge if too_large else BadInput
        what = f"is too large to decode (at most {max_pixels} pixels)" if too_large else "cannot decode as an image"
        raise kind(f"{path}: {what} ({type(exc).__name__}: {exc})") from None


def resize_rgb(rgb: np.ndarray, spec: VisionSpec) -> np.ndarray:
    """uint8 HxWx3 -> uint8 size x size x 3, bilinear, following ``spec.resize``."""
    Image = _pil()
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise BadInput(f"image array must be uint8 HxWx3, got {rgb.dtype} {rgb.shape}")
    img = Image.fromarray(rgb)
    size = spec.size
    if spec.resize is ResizeMode.STRETCH:
        img = img.resize((size, size), Image.BILINEAR)
    else:
        short = needed_side(spec)
        w, h = img.size
        scale = short / min(w, h)
        img = img.resize((max(size, round(w * scale)), max(size, round(h * scale))), Image.BILINEAR)
        w, h = img.size
        left, top = (w - size) // 2, (h - size) // 2
        img = img.crop((left, top, left + size, top + size))
    return np.asarray(img, dtype=np.uint8)


def normalize(rgb: np.ndarray, spec: VisionSpec) -> np.ndarray:
    """uint8 (N)xHxWx3 RGB at model size -> float32 in the model's color order and layout, before quantization."""
    x = rgb.astype(np.float32)
    if spec.color_order is ColorOrder.BGR:
        x = x[..., ::-1]
    x = (x - np.asarray(spec.mean, np.float32)) / np.asarray(spec.std, np.float32)
    if spec.layout is Layout.NCHW:
        x = np.moveaxis(x, -1, -3)
    return np.ascontiguousarray(x, dtype=np.float32)


def quantize(x: np.ndarray, q: TensorQuant) -> np.ndarray:
    if q.dtype == "float32":
        return x.astype(np.float32, copy=False)
    info = np.iinfo(np.dtype(q.dtype))
    return np.clip(np.round(x / q.scale) + q.zero_point, info.min, info.max).astype(q.dtype)


def dequantize(y: np.ndarray, q: TensorQuant) -> np.ndarray:
    if q.dtype == "float32":
        return y.astype(np.float32, copy=False)
    return (y.astype(np.float32) - q.zero_point) * q.scale


def image_tensor(images: list[np.ndarray], spec: VisionSpec) -> np.ndarray:
    """Decoded RGB images -> one float32 batch in model layout (not yet quantized)."""
    return normalize(np.stack([resize_rgb(img, spec) for img in images]), spec)


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log(softmax) along the last axis, in float64 (KL divergences between close distributions need it)."""
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


@dataclass(frozen=True)
class Label:
    index: int
    label: str
    score: float  # probability 0..1 (softmax of logits, or the model's own scores)

    def to_dict(self) -> dict[str, object]:
        return {"index": self.index, "label": self.label, "score": round(self.score, 6)}


def top_k(scores: np.ndarray, labels: list[str], k: int) -> list[Label]:
    """The k best classes of one score vector, best first."""
    if k < 1:
        raise BadInput(f"top-k {k} is not valid: use an integer >= 1")
    order = np.argsort(-scores, kind="stable")[: min(k, scores.shape[-1])]
    return [Label(int(i), labels[i] if i < len(labels) else f"class {i}", float(scores[i])) for i in order]


def read_labels(path: Path) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: cannot read labels ({exc})") from None
    labels = [line.strip() for line in lines]
    while labels and not labels[-1]:
        labels.pop()
    if not labels:
        raise BadInput(f"{path}: labels file is empty (one label per line)")
    return labels
