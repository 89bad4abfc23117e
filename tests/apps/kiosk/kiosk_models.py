"""Tiny real vision bundles for the kiosk's decision tests, and loaders that force timing around the real model.

The model is ONNX: mean of each color channel -> MatMul(W) -> 3 logits for the classes good, scratch, spot. With
W = GAIN * I a red part is "good", a green one "scratch", a blue one "spot", a grey one uncertain (1/3 each);
a permuted W (version 2) calls a red part "scratch", so two versions disagree on red parts.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from apps.kiosk.types import Part
from runtime.residency.loaders import VisionLoader
from tests.runtime.modelgen import onnx_model

LABELS = ("good", "scratch", "spot")
GAIN = 0.05  # logits differ by ~9 between a 220 and a 40 channel mean: p ~ 0.9998
COLORS = {"good": (220, 40, 40), "scratch": (40, 220, 40), "spot": (40, 40, 220), "grey": (128, 128, 128)}
V1 = np.eye(3, dtype=np.float32) * GAIN
V2 = np.eye(3, dtype=np.float32)[[1, 0, 2]] * GAIN  # red -> scratch, green -> good


def kiosk_bundle(directory: Path, version: str, w: np.ndarray = V1, size: int = 16, labels: tuple[str, ...] = LABELS) -> Path:
    """A vision bundle (ORT, NCHW, stretch resize to ``size``) around the channel-mean model with weights ``w``."""
    from onnx import helper

    from runtime.files import sha256_file

    directory.mkdir(parents=True)
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["pooled"]), helper.make_node("Flatten", ["pooled"], ["means"]),
             helper.make_node("MatMul", ["means", "w"], ["y"])]
    model = onnx_model(directory / "model.onnx", nodes, ["N", 3, size, size], ["N", 3], {"w": w.T.copy()})
    names = directory / "labels.txt"
    names.write_text("".join(f"{name}\n" for name in labels))
    files = [{"path": f.name, "sha256": sha256_file(f)[0], "size": f.stat().st_size, "role": role}
             for f, role in ((model, "weights"), (names, "labels"))]
    manifest = {"format": "edgerun.bundle", "schema_version": 1, "kind": "vision", "backend": "ort", "model_format": "onnx",
                "name": "parts", "version": version, "files": files,
                "vision": {"size": size, "layout": "nchw", "resize": "stretch", "labels": "labels.txt", "output_is_logits": True}}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory


def part(seq: int, color: str = "good", *, size: int = 24, **kw: Any) -> Part:
    image = np.empty((size, size + 8, 3), np.uint8)
    image[:] = COLORS[color]
    fields = {"seq": seq, "frame_id": f"f{seq:04d}", "source": "test", "t_capture": time.monotonic(), "image": image,
              "label": color}
    fields.update(kw)
    return Part(**fields)


class Slowed:
    """A loaded Classifier whose backend call waits ``delay_s`` first, or raises ``fail`` (timing forced, model real)."""

    def __init__(self, model: Any, loader: TimedLoader) -> None:
        self._model, self._loader = model, loader

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def scores(self, x: np.ndarray) -> np.ndarray:
        self._loader.batch_sizes.append(len(x))
        if self._loader.fail is not None and self._loader.fail(len(self._loader.batch_sizes)):
            raise RuntimeError("injected backend failure")
        if self._loader.infer_s:
            time.sleep(self._loader.infer_s)
        return self._model.scores(x)

    def close(self) -> None:
        self._model.close()


class TimedLoader(VisionLoader):
    """The real vision loader; ``load_s`` (per ref) delays a load after the model is built (half-loaded meanwhile);
    ``infer_s`` delays each batch; ``fail(n)`` makes batch n raise."""

    def __init__(self) -> None:
        super().__init__()
        self.load_s: dict[str, float] = {}
        self.loaded_at: dict[str, float] = {}  # ref -> when its load returned (monotonic)
        self.infer_s = 0.0
        self.fail: Any = None
        self.batch_sizes: list[int] = []
        self.lock = threading.Lock()

    def load(self, spec: Any, budget: int) -> Any:
        model = super().load(spec, budget)
        time.sleep(self.load_s.get(spec.ref, 0.0))
        self.loaded_at[spec.ref] = time.monotonic()
        return Slowed(model, self)


RED = np.array(COLORS["good"], np.float32) / 255.0  # the good part's patch feature (std 255)


def anomaly_bundle(directory: Path, version: str, *, size: int = 16, grid: int = 4, threshold: float = 0.3) -> Path:
    """An anomaly bundle (ORT) whose backbone is a grid x grid average pool of the channels / 255 and whose memory
    bank holds the one good patch: a red patch. A patch of another color is far from the bank."""
    from onnx import helper

    from runtime.files import sha256_file

    directory.mkdir(parents=True)
    k = size // grid
    nodes = [helper.make_node("AveragePool", ["x"], ["pooled"], kernel_shape=[k, k], strides=[k, k]),
             helper.make_node("Transpose", ["pooled"], ["y"], perm=[0, 2, 3, 1])]
    model = onnx_model(directory / "model.onnx", nodes, ["N", 3, size, size], ["N", grid, grid, 3], {})
    bank = directory / "bank.npy"
    np.save(bank, RED[None, :].astype(np.float32))
    files = [{"path": f.name, "sha256": sha256_file(f)[0], "size": f.stat().st_size, "role": role}
             for f, role in ((model, "weights"), (bank, "bank"))]
    manifest = {"format": "edgerun.bundle", "schema_version": 1, "kind": "anomaly", "backend": "ort", "model_format": "onnx",
                "name": "parts", "version": version, "files": files,
                "vision": {"size": size, "layout": "nchw", "resize": "stretch", "mean": [0.0], "std": [255.0],
                           "output_is_logits": False},
                "anomaly": {"backbone": "avgpool", "grid": grid, "channels": 3, "bank": "bank.npy", "bank_rows": 1,
                            "bank_dtype": "float32", "threshold": threshold, "false_reject": 0.01, "coreset": 1.0}}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory
