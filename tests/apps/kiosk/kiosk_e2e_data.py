"""Shared data for the kiosk's end-to-end tests: the generated parts dataset (scripts/make_parts.py) and a small
real vision bundle taught on its teach split.

The bundle is ONNX: the image (stretched to SIZE, /255) average-pooled to a GRID x GRID grid of colours, then a
linear layer to the logits of ``good`` and ``bad``, fitted by logistic regression (scikit-learn) on the teach
split's images as the kiosk's source reads them, preprocessed exactly as the bundle's manifest says. It is a
weak detector on purpose (colour blocks see wrong colours, spots and missing holes better than fine scratches):
the tests measure its accuracy on held-out parts and on the belt video and assert the floor measured here.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from runtime.files import sha256_file
from tests.runtime.modelgen import onnx_model

SIZE = 32
GRID = 8
LABELS = ("good", "bad")
DATA = dict(seed=5, size=64, n_good=40, n_bad=10, video_parts=12, frames_per_part=3)


def make_data(root: Path) -> Path:
    from scripts.make_parts import write_dataset

    write_dataset(root, **DATA)
    return root


def labelled_images(folder: Path) -> tuple[list[np.ndarray], list[str]]:
    """The images of ``folder`` (its labels.csv) as the kiosk's folder source reads them, with their labels."""
    from apps.kiosk.sources import read_image

    with open(folder / "labels.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    images = [read_image(folder / r["file"])[0] for r in rows]
    return images, [r["label"] for r in rows]


def write_bundle(directory: Path, version: str, w: np.ndarray, b: np.ndarray) -> Path:
    """A vision bundle: AveragePool(SIZE/GRID) -> Flatten -> MatMul(w) -> Add(b); w is (3*GRID*GRID, 2)."""
    from onnx import helper

    directory.mkdir(parents=True)
    k = SIZE // GRID
    nodes = [helper.make_node("AveragePool", ["x"], ["pooled"], kernel_shape=[k, k], strides=[k, k]),
             helper.make_node("Flatten", ["pooled"], ["flat"]), helper.make_node("MatMul", ["flat", "w"], ["wx"]),
             helper.make_node("Add", ["wx", "b"], ["y"])]
    model = onnx_model(directory / "model.onnx", nodes, ["N", 3, SIZE, SIZE], ["N", len(LABELS)],
                       {"w": w.astype(np.float32), "b": b.astype(np.float32)})
    names = directory / "labels.txt"
    names.write_text("".join(f"{name}\n" for name in LABELS))
    files = [{"path": f.name, "sha256": sha256_file(f)[0], "size": f.stat().st_size, "role": role}
             for f, role in ((model, "weights"), (names, "labels"))]
    manifest = {"format": "edgerun.bundle", "schema_version": 1, "kind": "vision", "backend": "ort", "model_format": "onnx",
                "name": "parts", "version": version, "files": files,
                "vision": {"size": SIZE, "layout": "nchw", "resize": "stretch", "mean": [0.0], "std": [255.0],
                           "labels": "labels.txt", "output_is_logits": True}}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory


def features(images: list[np.ndarray], spec) -> np.ndarray:
    """What the bundle's graph computes before its linear layer, in numpy (NCHW block means, flattened)."""
    from runtime.classify import preprocess

    x = preprocess.normalize(np.stack([preprocess.resize_rgb(im, spec) for im in images]), spec)  # N,3,S,S
    k = SIZE // GRID
    return x.reshape(len(images), 3, GRID, k, GRID, k).mean(axis=(3, 5)).reshape(len(images), -1)


def teach_bundle(data: Path, out: Path, version: str = "1") -> Path:
    """Fit the linear layer on ``data/teach`` and write the bundle to ``out``."""
    from sklearn.linear_model import LogisticRegression

    from runtime.bundle.resolve import resolve

    probe = write_bundle(out.parent / f".{out.name}-probe", "0", np.zeros((3 * GRID * GRID, 2)), np.zeros(2))
    spec = resolve(str(probe)).manifest.vision
    images, labels = labelled_images(data / "teach")
    y = np.array([label == "bad" for label in labels], int)
    clf = LogisticRegression(C=10.0, max_iter=2000, class_weight="balanced").fit(features(images, spec), y)
    # two logits whose softmax is the logistic model: good = 0, bad = w.x + b
    w = np.zeros((3 * GRID * GRID, 2))
    w[:, 1] = clf.coef_[0]
    b = np.array([0.0, clf.intercept_[0]])
    return write_bundle(out, version, w, b)


def teach_anomaly(parts: Path, out: Path) -> Path:
    """An anomaly bundle from ``edgerun kiosk teach``: the teach split's good images plus the good frames of a belt
    video of ANOTHER seed, decoded from the mp4 as the kiosk reads them (the codec moves patch features: an operator
    collects good parts from the line itself), tuned by the teach split's bad images. The tests' video is never seen."""
    from apps.cli import main
    from apps.kiosk.sources import VideoSource
    from scripts.make_parts import _png as png
    from scripts.make_parts import write_video

    good = out.parent / "teach-good"
    good.mkdir(parents=True)
    for p in sorted((parts / "teach" / "good").glob("*.png")):
        (good / p.name).write_bytes(p.read_bytes())
    video = write_video(out.parent / "other-belt.mp4", seed=DATA["seed"] + 1, size=DATA["size"],
                        n_parts=DATA["video_parts"], frames_per_part=DATA["frames_per_part"])
    with VideoSource(video) as frames:
        for part in frames:
            if part.label == "good":
                (good / f"belt_{part.seq:03d}.png").write_bytes(png(part.image))
    rc = main(["kiosk", "teach", "--good", str(good), "--bad", str(parts / "teach" / "bad"), "--out", str(out), "--json"])
    assert rc == 0, f"kiosk teach exited {rc}"
    return out
