"""Calibration and evaluation sets: image folders or .npz arrays, turned into float model inputs.

Images go through :func:`runtime.classify.preprocess.image_tensor` with the bundle's own
spec, so calibration sees what the runtime will feed. An evaluation folder may
hold its images in subfolders named by label (a label from the labels file, or
a class index); those give accuracy against labels. A capped folder is sampled
round-robin over its subfolders (:func:`balanced`), so 500 of 10,000 images see
every class folder, not the first few in sorted order. Without an evaluation set,
:func:`hold_out` keeps every fifth sample out of calibration for the gate to score.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from runtime.bundle.manifest import VisionSpec
from runtime.classify.preprocess import image_tensor, load_rgb
from runtime.errors import BadInput

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
MIN_CALIBRATION, MAX_CALIBRATION = 8, 500
MIN_EVALUATION = 4  # held-out samples the gate needs: one or two would make its agreement 0 %, 50 % or 100 %
HOLD_OUT_EVERY = 5  # no --eval: samples 4, 9, 14, ... (20 %) are scored by the gate and never calibrate


@dataclass(frozen=True)
class Samples:
    x: np.ndarray  # float32 model inputs, model layout, before input quantization
    labels: np.ndarray | None  # class index per sample, -1 unknown; None when the set has no labels
    names: tuple[str, ...]


def _images(folder: Path) -> list[Path]:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise BadInput(f"{folder}: no images found (looked for {', '.join(IMAGE_SUFFIXES)})")
    return files


def balanced(files: list[Path], limit: int | None) -> list[Path]:
    """Up to ``limit`` of ``files`` (sorted), taken round-robin over the folders that hold them: the first file of
    every folder, then the second of every folder, and so on. Deterministic; all of them when under the limit."""
    folders: dict[Path, list[Path]] = {}
    for f in files:
        folders.setdefault(f.parent, []).append(f)
    rounds = max(len(group) for group in folders.values())
    order = [group[i] for i in range(rounds) for group in folders.values() if i < len(group)]
    return order[:limit]


def hold_out(samples: Samples, every: int = HOLD_OUT_EVERY) -> tuple[Samples, Samples]:
    """(calibration, evaluation): one sample in ``every`` of each class goes to evaluation.

    The class is the sample's label, else its subfolder (an .npz without labels is one class). Within a class,
    sample r of class g is held out when (r + g) % every == every - 1: a class with ``every`` or more samples
    lands in both parts, and classes with fewer take turns. (Every ``every``-th sample of :func:`balanced`'s
    round-robin order would hold out whole classes: with 5 or 10 folders, the same folders every time.)
    A set too small to leave :data:`MIN_CALIBRATION` samples for calibration is refused."""
    n = len(samples.x)
    keys = samples.labels.tolist() if samples.labels is not None else [name.rpartition("/")[0] for name in samples.names]
    groups: dict[object, int] = {}  # class -> its index, in order of first appearance
    seen: dict[object, int] = {}  # class -> samples of it so far
    held = np.zeros(n, dtype=bool)
    for i, key in enumerate(keys):
        g = groups.setdefault(key, len(groups))
        r = seen[key] = seen.get(key, -1) + 1
        held[i] = (r + g) % every == every - 1
    if n - held.sum() < MIN_CALIBRATION or held.sum() < MIN_EVALUATION:
        need = max(n + 1, next(k for k in range(n, 4 * (MIN_CALIBRATION + MIN_EVALUATION) * every)
                               if k - k // every >= MIN_CALIBRATION and k // every >= MIN_EVALUATION))
        raise BadInput(f"{n} samples are too few to hold {100 // every} % out for the accuracy gate ({held.sum()} held out, at "
                       f"least {MIN_EVALUATION} needed) and still calibrate on {MIN_CALIBRATION}; give at least {need} (more "
                       "where classes have fewer than 5 samples), or an evaluation set with --eval")

    def part(mask: np.ndarray) -> Samples:
        labels = None if samples.labels is None else samples.labels[mask]
        return Samples(np.ascontiguousarray(samples.x[mask]), labels, tuple(np.array(samples.names, dtype=object)[mask]))

    return part(~held), part(held)


def _label_of(path: Path, root: Path, names: list[str]) -> int:
    if path.parent == root:
        return -1
    folder = path.parent.name
    if folder.isascii() and folder.isdigit():  # "²".isdigit(), but int("²") fails
        return int(folder)
    lowered = [n.lower() for n in names]
    return lowered.index(folder.lower()) if folder.lower() in lowered else -1


def load_samples(source: Path, spec: VisionSpec, input_shape: tuple[int, ...], labels: list[str] | None = None,
                 limit: int | None = None) -> Samples:
    """Images (folder) or arrays (.npz: one array, or 'x' and optional 'y') -> checked float inputs."""
    if not source.exists():
        raise BadInput(f"{source}: no such calibration/evaluation set (give a folder of images or an .npz)")
    if source.is_dir():
        files = balanced(_images(source), limit)
        x = image_tensor([load_rgb(p) for p in files], spec)
        ys = np.array([_label_of(p, source, labels or []) for p in files])
        return Samples(x, ys if (ys >= 0).any() else None, tuple(str(p.relative_to(source)) for p in files))
    if source.suffix != ".npz":
        raise BadInput(f"{source}: a calibration/evaluation set is a folder of images or an .npz file")
    try:
        with np.load(source, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except Exception as exc:
        raise BadInput(f"{source}: not a readable .npz ({type(exc).__name__}: {exc})") from None
    x = arrays.get("x", next(iter(arrays.values())) if len(arrays) == 1 else None)
    if x is None:
        raise BadInput(f"{source}: name the inputs 'x' (arrays found: {', '.join(arrays) or 'none'})")
    if x.dtype != np.float32:
        raise BadInput(f"{source}: inputs are {x.dtype}; give float32 model inputs (already normalized, in model layout)")
    if x.ndim != len(input_shape) or tuple(x.shape[1:]) != tuple(input_shape[1:]):
        raise BadInput(f"{source}: inputs have shape {x.shape}; the model takes (N, {', '.join(map(str, input_shape[1:]))})")
    if len(x) == 0:
        raise BadInput(f"{source}: the set is empty")
    y = arrays.get("y")
    if y is not None and (y.shape != (len(x),) or not np.issubdtype(y.dtype, np.integer)):
        raise BadInput(f"{source}: labels 'y' must be {len(x)} integers, got {y.dtype} {y.shape}")
    x = x[:limit]
    return Samples(np.ascontiguousarray(x), None if y is None else y[:limit], tuple(f"{source.name}[{i}]" for i in range(len(x))))


def check_calibration(samples: Samples, where: Path) -> None:
    n = len(samples.x)
    if n < MIN_CALIBRATION:
        raise BadInput(f"{where}: {n} calibration samples is too few for static INT8 (at least {MIN_CALIBRATION}; 100-500 recommended)")
    if not np.isfinite(samples.x).all():
        raise BadInput(f"{where}: calibration inputs contain NaN or infinity")
