"""Pictures of a part for people: the frame with its anomaly heat map blended in, encoded as JPEG or PNG.

OpenCV (the ``kiosk`` extra) is imported when a picture is first made, never at import time.
"""

from __future__ import annotations

import numpy as np

from runtime.errors import BadInput, missing

HEAT_ALPHA = 0.55  # weight of the heat colour where the heat map is 1; where it is 0 the frame shows unchanged
MAX_SIDE = 640  # pixels: the dashboard never needs more, and a smaller picture encodes faster
FORMATS = ("jpeg", "png")


def _cv2():
    try:
        import cv2
    except ModuleNotFoundError:
        raise missing("cv2", "kiosk") from None
    return cv2


def as_rgb(image: np.ndarray) -> np.ndarray:
    """An HxWx3 uint8 RGB view of ``image`` (HxW grey and HxWx4 RGBA are converted); BadInput for anything else."""
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8:
        raise BadInput(f"a part's image must be a uint8 numpy array, got {getattr(image, 'dtype', type(image))}")
    if image.ndim == 2:
        return np.repeat(image[:, :, None], 3, axis=2)
    if image.ndim == 3 and image.shape[2] in (3, 4) and image.shape[0] > 0 and image.shape[1] > 0:
        return image[:, :, :3]
    raise BadInput(f"a part's image must be HxWx3 RGB, got shape {image.shape}")


def blend(image: np.ndarray, heatmap: np.ndarray | None) -> np.ndarray:
    """``image`` (RGB) with ``heatmap`` (HxW, values in [0, 1], any size: resized to the image) drawn over it in
    the JET colours, more opaque where the heat is higher. Without a heat map: the image itself."""
    rgb = as_rgb(image)
    if heatmap is None:
        return rgb
    heat = np.asarray(heatmap, dtype=np.float32)
    if heat.ndim != 2 or heat.size == 0:
        raise BadInput(f"a heat map must be HxW, got shape {heat.shape}")
    cv2 = _cv2()
    heat = np.clip(np.nan_to_num(heat, nan=0.0, posinf=1.0, neginf=0.0), 0.0, 1.0)
    if heat.shape != rgb.shape[:2]:
        heat = cv2.resize(heat, (rgb.shape[1], rgb.shape[0]), interpolation=cv2.INTER_LINEAR)
    colour = cv2.applyColorMap((heat * 255).astype(np.uint8), cv2.COLORMAP_JET)[:, :, ::-1]  # BGR -> RGB
    alpha = (HEAT_ALPHA * heat)[:, :, None]
    return (rgb * (1.0 - alpha) + colour * alpha).astype(np.uint8)


def encode(image: np.ndarray, heatmap: np.ndarray | None = None, *, fmt: str = "jpeg", quality: int = 80,
           max_side: int = MAX_SIDE) -> bytes:
    """The picture of a part as JPEG or PNG bytes, scaled down so its longer side is at most ``max_side``."""
    if fmt not in FORMATS:
        raise BadInput(f"unknown picture format {fmt!r}; use one of {', '.join(FORMATS)}")
    cv2 = _cv2()
    picture = blend(image, heatmap)
    height, width = picture.shape[:2]
    scale = max_side / max(height, width)
    if scale < 1.0:
        size = (max(1, round(width * scale)), max(1, round(height * scale)))
        picture = cv2.resize(picture, size, interpolation=cv2.INTER_AREA)
    bgr = np.ascontiguousarray(picture[:, :, ::-1])
    if fmt == "jpeg":
        ok, data = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
    else:
        ok, data = cv2.imencode(".png", bgr)
    if not ok:  # pragma: no cover - OpenCV encodes any uint8 HxWx3 array
        raise BadInput(f"OpenCV could not encode a {width}x{height} picture as {fmt}")
    return data.tobytes()
