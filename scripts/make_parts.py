"""Generate the kiosk's parts dataset, seeded: metal plates with holes on a conveyor belt, good and defective.

A part is a brushed-steel plate with four corner holes and a centre hole, lying on a gravel-textured belt.
The textures are real photos that ship in scikit-image's data module (``brick`` for the metal grain,
``gravel`` for the belt), so nothing is downloaded. Defects (``DEFECTS``):

* ``scratch``: one or two thin bright or dark lines across the plate;
* ``spot``: a rust/oil stain with a soft edge;
* ``missing_hole``: one of the five holes was never drilled;
* ``wrong_color``: the plate is brass, copper or painted instead of steel;
* ``bent_edge``: one corner is folded up: a shaded, foreshortened triangle and a notch in the outline.

Every image varies in lighting (gain, a directional gradient, colour temperature), position, rotation,
scale, blur and sensor noise. The same seed gives the same bytes; image ``i`` of a category depends only on
``(seed, category, i)``, so asking for more images does not change the first ones.

Layout written by :func:`write_dataset` (``OUT``)::

    OUT/labels.csv                    file,label,defect,split,seen   (file relative to OUT)
    OUT/teach/good/*.png              good parts for teaching
    OUT/teach/bad/<defect>/*.png      part of each *taught* defect (tunes the threshold / supervised head)
    OUT/teach/labels.csv              the same rows, file relative to OUT/teach
    OUT/test/good/*.png               held-out good parts
    OUT/test/bad/<defect>/*.png       the rest of the taught defects and ALL of the unseen ones
    OUT/test/labels.csv
    OUT/belt.mp4, OUT/belt.csv        a belt video (mp4v) and its per-frame labels: frame,part,label,defect

``label`` is ``good`` or ``bad``; ``defect`` is empty for good parts; ``seen`` is 1 when the defect type is
among ``teach_defects`` (0 for the held-out types, which measure the detector on defects it never saw).

Usage::

    python scripts/make_parts.py OUT [--seed 0] [--size 96] [--good 100] [--bad 20]
        [--teach-defects scratch,spot,missing_hole] [--teach-fraction 0.5] [--video-parts 12] [--frames-per-part 6]
"""

from __future__ import annotations

import argparse
import csv
import functools
import io
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger("make_parts")

DEFECTS = ("scratch", "spot", "missing_hole", "wrong_color", "bent_edge")
DEFAULT_TEACH_DEFECTS = ("scratch", "spot", "missing_hole")  # wrong_color and bent_edge stay unseen
SIZE_RANGE = (32, 512)  # pixels per side
MAX_IMAGES = 20000  # per category: bounds a typo like --good 1e9
MAX_VIDEO_PARTS = 2000
FPS = 10.0
_SS = 2  # supersampling factor: parts are drawn at twice the size and reduced (anti-aliased edges)
_STEEL = (178.0, 182.0, 190.0)  # RGB of a good plate under neutral light
_WRONG_COLORS = ((205.0, 170.0, 90.0), (190.0, 110.0, 70.0), (70.0, 110.0, 190.0), (180.0, 60.0, 50.0), (80.0, 150.0, 80.0))
_VIDEO_STREAM = 99  # rng stream of the belt video (categories use 0..len(DEFECTS))


@dataclass(frozen=True)
class PartSpec:
    """Every random choice for one part; :func:`draw` turns it into pixels (deterministically)."""

    defect: str | None
    color: tuple[float, float, float]  # plate RGB
    grain_xy: tuple[int, int]  # crop origin in the metal texture
    belt_xy: tuple[int, int]  # crop origin in the belt texture
    angle: float  # degrees
    shift: tuple[float, float]  # fraction of the image size
    scale: float
    gain: float
    gradient: tuple[float, float]  # (direction in radians, amplitude as a fraction of the gain)
    tint: tuple[float, float, float]  # per-channel colour temperature
    blur: float  # Gaussian sigma in output pixels (0: sharp)
    noise: float  # sensor noise sigma in grey levels
    noise_seed: int
    missing: int  # index of the undrilled hole (missing_hole), else -1
    strokes: tuple[tuple[float, float, float, float, float], ...]  # scratches: x0, y0, x1, y1, brightness
    stain: tuple[float, float, float, float, float]  # spot: cx, cy, rx, ry, angle (plate-relative)
    bend: tuple[int, float, float]  # bent_edge: corner 0..3, leg (fraction of size), shading factor


@functools.lru_cache(maxsize=1)
def _textures() -> tuple[np.ndarray, np.ndarray]:
    """(metal grain, belt) as float32 in [-1, 1] and [0, 1]: real photos shipped with scikit-image."""
    from skimage import data

    grain = data.brick().astype(np.float32)
    grain = (grain - grain.mean()) / (grain.std() + 1e-6)
    belt = data.gravel().astype(np.float32) / 255.0
    return np.clip(grain / 2.5, -1.0, 1.0), belt


def sample_part(rng: np.random.Generator, defect: str | None) -> PartSpec:
    """Draw every random choice of one part (``defect`` None for a good part)."""
    if defect is not None and defect not in DEFECTS:
        raise ValueError(f"unknown defect {defect!r}; valid: {', '.join(DEFECTS)}")
    base = np.array(_STEEL) + rng.uniform(-6, 6, 3)
    if defect == "wrong_color":
        base = np.array(_WRONG_COLORS[rng.integers(len(_WRONG_COLORS))]) + rng.uniform(-8, 8, 3)
    strokes = ()
    if defect == "scratch":
        bright = float(rng.choice([rng.uniform(1.25, 1.45), rng.uniform(0.35, 0.55)]))
        strokes = tuple(
            (*rng.uniform([-0.42, -0.38], [0.42, 0.38]), *rng.uniform([-0.42, -0.38], [0.42, 0.38]), bright)
            for _ in range(int(rng.integers(1, 3)))
        )
        # a scratch is long: redraw the end point opposite the start when the pair came out short
        strokes = tuple((x0, y0, -x0 if abs(x1 - x0) < 0.25 else x1, y1, b) for x0, y0, x1, y1, b in strokes)
    stain = (0.0, 0.0, 0.0, 0.0, 0.0)
    if defect == "spot":
        stain = (*rng.uniform([-0.3, -0.25], [0.3, 0.25]), *rng.uniform(0.035, 0.07, 2), float(rng.uniform(0, 180)))
    return PartSpec(
        defect=defect,
        color=tuple(float(c) for c in base),
        grain_xy=tuple(int(v) for v in rng.integers(0, 256, 2)),
        belt_xy=tuple(int(v) for v in rng.integers(0, 256, 2)),
        angle=float(rng.uniform(-20, 20)),
        shift=tuple(float(v) for v in rng.uniform(-0.08, 0.08, 2)),
        scale=float(rng.uniform(0.92, 1.08)),
        gain=float(rng.uniform(0.78, 1.22)),
        gradient=(float(rng.uniform(0, 2 * np.pi)), float(rng.uniform(0.0, 0.22))),
        tint=tuple(float(v) for v in rng.uniform(0.97, 1.03, 3)),
        blur=float(rng.uniform(0.3, 1.0)) if rng.random() < 0.5 else 0.0,
        noise=float(rng.uniform(1.0, 5.0)),
        noise_seed=int(rng.integers(2**31)),
        missing=int(rng.integers(5)) if defect == "missing_hole" else -1,
        strokes=strokes,
        stain=stain,
        bend=(int(rng.integers(4)), float(rng.uniform(0.11, 0.15)), float(rng.choice([rng.uniform(0.5, 0.65), rng.uniform(1.25, 1.4)])))
        if defect == "bent_edge" else (0, 0.0, 1.0),
    )


def _crop(texture: np.ndarray, xy: tuple[int, int], n: int) -> np.ndarray:
    """An n x n window of a texture starting at xy, wrapping around (so a scrolling belt never runs out)."""
    h, w = texture.shape
    rows = (np.arange(n) + xy[1]) % h
    cols = (np.arange(n) + xy[0]) % w
    return texture[np.ix_(rows, cols)]


def draw(spec: PartSpec, size: int, *, dx: float = 0.0, belt_scroll: int = 0, noise_seed: int | None = None) -> np.ndarray:
    """Render ``spec`` as a size x size x 3 uint8 RGB image.

    ``dx`` moves the part along the belt (fraction of the size), ``belt_scroll`` scrolls the belt texture
    (output pixels), ``noise_seed`` overrides the sensor noise (each video frame has its own).
    """
    import cv2

    n = size * _SS
    grain, belt = _textures()
    w, h = 0.62 * n, 0.44 * n
    x0, y0, x1, y1 = (n - w) / 2, (n - h) / 2, (n + w) / 2, (n + h) / 2
    fix = 16  # cv2 fixed-point shift: sub-pixel polygon vertices
    corners = np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]])
    mask = np.zeros((n, n), np.uint8)
    shade = np.ones((n, n), np.float32)
    outline = corners
    if spec.defect == "bent_edge":
        corner, leg, factor = spec.bend
        leg *= n
        c = corners[corner]
        prev_c, next_c = corners[corner - 1], corners[(corner + 1) % 4]
        a = c + (prev_c - c) / np.linalg.norm(prev_c - c) * leg
        b = c + (next_c - c) / np.linalg.norm(next_c - c) * leg
        mid = (a + b) / 2
        tip = mid + (c - mid) * 0.35  # the folded-up flap, seen from above, is foreshortened
        outline = np.concatenate([corners[:corner], [a, b], corners[corner + 1:]]) if corner else np.array([b, *corners[1:], a])
        flap = np.zeros_like(mask)
        cv2.fillPoly(flap, [np.round(np.array([a, tip, b]) * (1 << fix)).astype(np.int32)], 255, cv2.LINE_AA, fix)
        shade[flap > 0] = factor
        mask = np.maximum(mask, flap)
    cv2.fillPoly(mask, [np.round(outline * (1 << fix)).astype(np.int32)], 255, cv2.LINE_AA, fix)
    holes = [(x0 + 0.14 * w, y0 + 0.2 * h), (x1 - 0.14 * w, y0 + 0.2 * h), (x1 - 0.14 * w, y1 - 0.2 * h),
             (x0 + 0.14 * w, y1 - 0.2 * h), (n / 2, n / 2)]
    radii = [0.045 * n] * 4 + [0.07 * n]
    for i, ((hx, hy), r) in enumerate(zip(holes, radii, strict=True)):
        if i != spec.missing:
            cv2.circle(mask, (round(hx * (1 << fix)), round(hy * (1 << fix))), round(r * (1 << fix)), 0, -1, cv2.LINE_AA, fix)
    # plate surface: base colour x metal grain, edges slightly darker (a bevel catches less light)
    surface = np.empty((n, n, 3), np.float32)
    surface[:] = spec.color
    surface *= (1.0 + 0.07 * _crop(grain, spec.grain_xy, n))[..., None]
    surface *= shade[..., None]
    bevel = cv2.erode(mask, np.ones((3 * _SS, 3 * _SS), np.uint8))
    surface[(mask > 0) & (bevel == 0)] *= 0.82
    for sx0, sy0, sx1, sy1, bright in spec.strokes:
        pts = [(round((n / 2 + sx * w) * (1 << fix)), round((n / 2 + sy * h) * (1 << fix))) for sx, sy in ((sx0, sy0), (sx1, sy1))]
        line = np.zeros((n, n), np.uint8)
        cv2.line(line, pts[0], pts[1], 255, max(1, round(n / 80)), cv2.LINE_AA, fix)
        alpha = (line.astype(np.float32) / 255.0)[..., None]
        surface = surface * (1 - alpha) + np.clip(surface * bright, 0, 255) * alpha
    if spec.defect == "spot":
        cx, cy, rx, ry, ang = spec.stain
        stain = np.zeros((n, n), np.float32)
        axes = (max(1, round(rx * n)), max(1, round(ry * n)))
        cv2.ellipse(stain, (round(n / 2 + cx * w), round(n / 2 + cy * h)), axes, ang, 0, 360, 1.0, -1)
        stain = cv2.GaussianBlur(stain, (0, 0), 0.012 * n)[..., None] * 0.85
        surface = surface * (1 - stain) + np.array([105.0, 70.0, 40.0]) * stain
    # pose: rotate/scale about the centre, then shift (plus the belt's motion)
    m = cv2.getRotationMatrix2D((n / 2, n / 2), spec.angle, spec.scale)
    m[:, 2] += ((spec.shift[0] + dx) * n, spec.shift[1] * n)
    alpha = cv2.warpAffine(mask, m, (n, n), flags=cv2.INTER_LINEAR).astype(np.float32)[..., None] / 255.0
    surface = cv2.warpAffine(surface, m, (n, n), flags=cv2.INTER_LINEAR)
    ground = _crop(belt, (spec.belt_xy[0] - belt_scroll * _SS, spec.belt_xy[1]), n)
    ground = (35.0 + 70.0 * ground)[..., None] * np.array([1.0, 1.0, 1.04], np.float32)
    img = surface * alpha + ground * (1 - alpha)
    # a part casts a soft shadow on the belt below-right of it
    shadow = cv2.GaussianBlur(np.roll(alpha[..., 0], (2 * _SS, 2 * _SS), (0, 1)), (0, 0), 2.0 * _SS)[..., None]
    img *= 1.0 - 0.35 * shadow * (1 - alpha)
    img = cv2.resize(img, (size, size), interpolation=cv2.INTER_AREA)
    # lighting: gain, a directional gradient, colour temperature
    theta, amp = spec.gradient
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size - 0.5
    light = spec.gain * (1.0 + amp * 2 * (xx * np.cos(theta) + yy * np.sin(theta)))
    img = img * light[..., None] * np.array(spec.tint, np.float32)
    if spec.blur > 0:
        img = cv2.GaussianBlur(img, (0, 0), spec.blur)
    noise_rng = np.random.default_rng(spec.noise_seed if noise_seed is None else noise_seed)
    img = img + noise_rng.normal(0.0, spec.noise, img.shape).astype(np.float32)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def _rng(seed: int, stream: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, stream, index])


def render(seed: int, defect: str | None, index: int, size: int = 96) -> np.ndarray:
    """Image ``index`` of a category (``defect`` None: good) for ``seed``: HxWx3 uint8 RGB."""
    stream = 0 if defect is None else 1 + DEFECTS.index(defect) if defect in DEFECTS else -1
    if stream < 0:
        raise ValueError(f"unknown defect {defect!r}; valid: {', '.join(DEFECTS)}")
    return draw(sample_part(_rng(seed, stream, index), defect), size)


def _png(image: np.ndarray) -> bytes:
    import cv2

    ok, buf = cv2.imencode(".png", image[..., ::-1], [cv2.IMWRITE_PNG_COMPRESSION, 6])
    if not ok:
        raise RuntimeError("PNG encoding failed")
    return buf.tobytes()


def _check(size: int, n_good: int, n_bad: int, teach_defects: tuple[str, ...], teach_fraction: float) -> None:
    if not SIZE_RANGE[0] <= size <= SIZE_RANGE[1]:
        raise ValueError(f"size {size} is outside {SIZE_RANGE[0]}..{SIZE_RANGE[1]} pixels")
    for name, v in (("good", n_good), ("bad", n_bad)):
        if not 0 <= v <= MAX_IMAGES:
            raise ValueError(f"{name}={v} is outside 0..{MAX_IMAGES} images")
    unknown = [d for d in teach_defects if d not in DEFECTS]
    if unknown:
        raise ValueError(f"unknown teach defect {unknown[0]!r}; valid: {', '.join(DEFECTS)}")
    if not 0.0 <= teach_fraction <= 1.0:
        raise ValueError(f"teach fraction {teach_fraction} is outside 0..1")


def write_dataset(
    out: str | Path,
    *,
    seed: int = 0,
    size: int = 96,
    n_good: int = 100,
    n_bad: int = 20,
    teach_defects: tuple[str, ...] = DEFAULT_TEACH_DEFECTS,
    teach_fraction: float = 0.5,
    video_parts: int = 12,
    frames_per_part: int = 6,
) -> list[dict[str, str]]:
    """Write the dataset (layout in the module docstring) and return the rows of labels.csv.

    ``n_bad`` images per defect type. ``teach_fraction`` of the good images, and of each taught defect's
    images, go to ``teach/``; the rest, and every image of a defect not in ``teach_defects``, go to ``test/``.
    """
    _check(size, n_good, n_bad, tuple(teach_defects), teach_fraction)
    out = Path(out)
    rows: list[dict[str, str]] = []
    for defect in (None, *DEFECTS):
        count = n_good if defect is None else n_bad
        n_teach = 0 if defect is not None and defect not in teach_defects else round(count * teach_fraction)
        for i in range(count):
            split = "teach" if i < n_teach else "test"
            sub = Path(split) / ("good" if defect is None else Path("bad") / defect)
            name = f"{'good' if defect is None else defect}_{i:04d}.png"
            (out / sub).mkdir(parents=True, exist_ok=True)
            (out / sub / name).write_bytes(_png(render(seed, defect, i, size)))
            rows.append({"file": (sub / name).as_posix(), "label": "good" if defect is None else "bad",
                         "defect": defect or "", "split": split, "seen": "1" if defect is None or defect in teach_defects else "0"})
    _write_csv(out / "labels.csv", rows)
    for split in ("teach", "test"):
        mine = [dict(r, file=r["file"].split("/", 1)[1]) for r in rows if r["split"] == split]
        if mine:
            _write_csv(out / split / "labels.csv", mine)
    if video_parts:
        write_video(out / "belt.mp4", seed=seed, size=size, n_parts=video_parts, frames_per_part=frames_per_part)
    log.info("wrote %d images to %s", len(rows), out)
    return rows


def _write_csv(path: Path, rows: list[dict[str, str]]) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    path.write_text(buf.getvalue())


def belt_parts(seed: int, n_parts: int, bad_every: int = 3) -> list[str | None]:
    """The defect of each part on the belt (None: good): every ``bad_every``-th part is bad, types cycling."""
    rng = _rng(seed, _VIDEO_STREAM, 0)
    return [DEFECTS[int(rng.integers(len(DEFECTS)))] if k % bad_every == bad_every - 1 else None for k in range(n_parts)]


def belt_frames(seed: int, size: int = 96, n_parts: int = 12, frames_per_part: int = 6):
    """Yield (frame, part index, defect, image) for the belt video: each part slides across the view over
    ``frames_per_part`` frames (always wholly in view, so every frame shows exactly one part)."""
    if not 1 <= n_parts <= MAX_VIDEO_PARTS:
        raise ValueError(f"video parts {n_parts} is outside 1..{MAX_VIDEO_PARTS}")
    if not 1 <= frames_per_part <= 100:
        raise ValueError(f"frames per part {frames_per_part} is outside 1..100")
    frame = 0
    for k, defect in enumerate(belt_parts(seed, n_parts)):
        spec = sample_part(_rng(seed, _VIDEO_STREAM, k + 1), defect)
        spec = PartSpec(**{**spec.__dict__, "shift": (0.0, spec.shift[1])})  # the belt decides x
        for j in range(frames_per_part):
            dx = -0.12 + 0.24 * (j / max(1, frames_per_part - 1))
            yield frame, k, defect, draw(spec, size, dx=dx, belt_scroll=round(dx * size), noise_seed=seed * 1_000_003 + frame)
            frame += 1


def write_video(path: str | Path, *, seed: int = 0, size: int = 96, n_parts: int = 12, frames_per_part: int = 6) -> Path:
    """Write the belt video (mp4v, ``FPS``) and ``<stem>.csv`` next to it: frame,part,label,defect."""
    import cv2

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), FPS, (size, size))
    if not writer.isOpened():
        raise RuntimeError(f"cv2.VideoWriter cannot write mp4v to {path}")
    rows = []
    try:
        for frame, k, defect, image in belt_frames(seed, size, n_parts, frames_per_part):
            writer.write(np.ascontiguousarray(image[..., ::-1]))
            rows.append({"frame": str(frame), "part": str(k), "label": "bad" if defect else "good", "defect": defect or ""})
    finally:
        writer.release()
    _write_csv(path.with_suffix(".csv"), rows)
    return path


def _defects(text: str) -> tuple[str, ...]:
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [n for n in names if n not in DEFECTS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown defect {bad[0]!r}; valid: {', '.join(DEFECTS)}")
    return names


def _bounded(lo: float, hi: float, kind=int):
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{v} is outside {lo}..{hi}")
        return v

    return parse


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="output folder (created)")
    p.add_argument("--seed", type=_bounded(0, 2**32 - 1), default=0)
    p.add_argument("--size", type=_bounded(*SIZE_RANGE), default=96, help="image side in pixels (default 96)")
    p.add_argument("--good", type=_bounded(0, MAX_IMAGES), default=100, help="good images (default 100)")
    p.add_argument("--bad", type=_bounded(0, MAX_IMAGES), default=20, help="images per defect type (default 20)")
    p.add_argument("--teach-defects", type=_defects, default=DEFAULT_TEACH_DEFECTS,
                   help=f"comma list of defect types that may be taught (default {','.join(DEFAULT_TEACH_DEFECTS)}); the others are unseen")
    p.add_argument("--teach-fraction", type=_bounded(0.0, 1.0, float), default=0.5,
                   help="share of good and taught-defect images put in teach/ (default 0.5)")
    p.add_argument("--video-parts", type=_bounded(0, MAX_VIDEO_PARTS), default=12, help="parts in belt.mp4 (0: no video)")
    p.add_argument("--frames-per-part", type=_bounded(1, 100), default=6)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    rows = write_dataset(args.out, seed=args.seed, size=args.size, n_good=args.good, n_bad=args.bad,
                         teach_defects=args.teach_defects, teach_fraction=args.teach_fraction,
                         video_parts=args.video_parts, frames_per_part=args.frames_per_part)
    print(f"{len(rows)} images and {'belt.mp4' if args.video_parts else 'no video'} in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
