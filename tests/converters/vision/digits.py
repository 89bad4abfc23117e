"""A tiny digit classifier trained in the test session (sklearn's 8x8 digits, grey -> RGB), and its files.

``make_digits(folder)`` trains a 2-conv CNN for a few seconds (batch-norm
statistics come from training, so INT8 calibration means something), then
writes what ``edgerun convert vision`` takes: an ExportedProgram (.pt2), a
calibration folder, an evaluation folder with one subfolder per label, and
labels.txt. Held-out accuracy is ~95 %.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

SIZE = 8
LABELS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
MEAN, STD = 127.5, 127.5  # pixel units, the convention edgerun's --mean/--std take


@dataclass(frozen=True)
class Digits:
    pt2: Path
    calib: Path
    eval: Path
    labels: Path
    test_images: list[Path]  # one file per held-out image, name says its label
    test_labels: list[int]
    accuracy: float  # torch float model on the held-out images


def _rgb(images: np.ndarray) -> np.ndarray:
    grey = np.clip(images * (255.0 / 16.0), 0, 255).astype(np.uint8)
    return np.repeat(grey[..., None], 3, axis=-1)


def make_digits(folder: Path) -> Digits:
    import torch
    from PIL import Image
    from sklearn.datasets import load_digits

    torch.manual_seed(0)
    data = load_digits()
    rgb = _rgb(data.images)
    y = data.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    train, test = order[:1400], order[1400:]
    x = torch.from_numpy(((rgb.astype(np.float32) - MEAN) / STD).transpose(0, 3, 1, 2).copy())
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10),
    )
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    yt = torch.from_numpy(y)
    for _epoch in range(30):
        for start in range(0, len(train), 100):
            idx = torch.from_numpy(train[start : start + 100])
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[idx]), yt[idx]).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        accuracy = float((model(x[test]).argmax(1) == yt[test]).float().mean())
    pt2 = folder / "digits.pt2"
    torch.export.save(torch.export.export(model, (x[:1],)), str(pt2))

    def save(path: Path, i: int) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rgb[i]).save(path)
        return path

    for i in train[:200]:
        save(folder / "calib" / f"{i:04d}.png", int(i))
    tests = [save(folder / "eval" / LABELS[y[i]] / f"{i:04d}.png", int(i)) for i in test]
    (folder / "labels.txt").write_text("\n".join(LABELS) + "\n")
    return Digits(pt2, folder / "calib", folder / "eval", folder / "labels.txt", tests, [int(y[i]) for i in test], accuracy)


def make_keras_digits(folder: Path) -> tuple[Path, Path, float]:
    """The same task in Keras (NHWC): a ``.keras`` file, a SavedModel directory, and held-out accuracy."""
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    from sklearn.datasets import load_digits

    tf.keras.utils.set_random_seed(0)
    data = load_digits()
    x = (_rgb(data.images).astype(np.float32) - MEAN) / STD
    y = data.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    train, test = order[:1400], order[1400:]
    layers = tf.keras.layers
    model = tf.keras.Sequential([
        tf.keras.Input((SIZE, SIZE, 3)),
        layers.Conv2D(16, 3, padding="same"), layers.BatchNormalization(), layers.ReLU(),
        layers.Conv2D(32, 3, strides=2, padding="same"), layers.BatchNormalization(), layers.ReLU(),
        layers.GlobalAveragePooling2D(), layers.Dense(10),
    ])
    model.compile(optimizer=tf.keras.optimizers.Adam(0.01), loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x[train], y[train], epochs=30, batch_size=100, verbose=0)
    accuracy = float((model.predict(x[test], verbose=0).argmax(1) == y[test]).mean())
    keras_file, saved = folder / "digits.keras", folder / "digits_savedmodel"
    model.save(keras_file)
    model.export(str(saved), format="tf_saved_model", verbose=False)
    return keras_file, saved, accuracy
