"""Real photos with known content, from packages (scikit-image, scikit-learn, matplotlib), and sets made from them.

``expected`` lists the ImageNet-1k indices that count as a correct top-1 label
for each photo (several where ImageNet splits one object into near-synonyms);
an empty tuple means the photo has no ImageNet class and is used for agreement only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from runtime.errors import require


@dataclass(frozen=True)
class Photo:
    name: str
    rgb: np.ndarray  # uint8 HxWx3
    expected: tuple[int, ...]  # accepted ImageNet indices; () when none applies


def _read(path: Path) -> np.ndarray:
    from runtime.classify.preprocess import load_rgb

    return load_rgb(path)


def photos() -> list[Photo]:
    data = require("skimage.data", "pip install scikit-image", purpose="the sample photos")
    sklearn_images = Path(require("sklearn.datasets", "pip install scikit-learn", purpose="the sample photos").__file__).parent / "images"
    mpl = require("matplotlib", "pip install matplotlib", purpose="the sample photos")
    return [
        Photo("chelsea", data.chelsea(), (281, 282, 285, 287)),  # tabby, tiger cat, Egyptian cat, lynx
        Photo("coffee", data.coffee(), (967, 968, 504)),  # espresso, cup, coffee mug
        Photo("rocket", data.rocket(), (657, 744, 812)),  # missile, projectile, space shuttle
        Photo("astronaut", data.astronaut(), ()),
        Photo("motorcycle", data.stereo_motorcycle()[0], (670, 665)),  # motor scooter, moped
        Photo("china", _read(sklearn_images / "china.jpg"), (698, 832)),  # palace, stupa
        Photo("flower", _read(sklearn_images / "flower.jpg"), ()),
        # military uniform, bow tie, suit, Windsor tie
        Photo("grace_hopper", _read(Path(mpl.get_data_path()) / "sample_data" / "grace_hopper.jpg"), (652, 457, 834, 906)),
    ]


def variants(base: list[np.ndarray], n: int, seed: int = 0) -> list[np.ndarray]:
    """``n`` images made from ``base`` by random crops (50-100 % of each side), flips and brightness/contrast changes.

    A generated evaluation or calibration set with real image statistics, where
    noise images would leave the gate with nothing meaningful to agree on.
    """
    rng = np.random.default_rng(seed)
    out: list[np.ndarray] = []
    for i in range(n):
        img = base[i % len(base)]
        h, w = img.shape[:2]
        ch, cw = int(h * rng.uniform(0.5, 1.0)), int(w * rng.uniform(0.5, 1.0))
        top, left = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
        crop = img[top : top + ch, left : left + cw].astype(np.float32)
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        crop = (crop - 128.0) * rng.uniform(0.75, 1.25) + 128.0 + rng.uniform(-25, 25)
        out.append(np.ascontiguousarray(np.clip(crop, 0, 255).astype(np.uint8)))
    return out


def benchmark_sets(base: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The calibration set (128 variants) and evaluation set (``base`` itself plus 192 other variants) that
    bench/vision.py reports agreement on, for every measurement compared with its table."""
    return variants(base, 128, seed=1), base + variants(base, 192, seed=2)


def write_folder(images: list[np.ndarray], folder: Path, names: list[str] | None = None) -> list[Path]:
    """Save images as PNG files (for CLI --calib/--eval folders); returns the paths."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, img in enumerate(images):
        path = folder / f"{names[i] if names else f'{i:04d}'}.png"
        Image.fromarray(img).save(path)
        paths.append(path)
    return paths
