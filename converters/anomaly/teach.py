"""Teach an anomaly bundle from images of good parts (PatchCore), optionally tuned by defective ones.

Steps, all under a temporary directory beside ``out`` (removed on any failure; the bundle appears by one rename,
runtime.bundle.store.publish through converters.classifier.package):

1. the good images are split: every :data:`HOLD_OUT_EVERY`-th is held out to calibrate the threshold, the
   rest teach (they calibrate INT8 and fill the memory bank);
2. the backbone (:mod:`converters.anomaly.backbone`) is exported and quantized to full-integer INT8 through the
   vision converter's route (converters.classifier.quantize.build_quantized: GPTQ rounding, calibrated on the
   teaching images);
3. the feature gate: the INT8 and float backbones over the held-out images, patch by patch; the cosine
   similarity of their features must stay at or above :data:`MIN_FEATURE_COSINE` (a feature model has no
   top-1 to agree on, so the classifier gate does not apply);
4. the teaching images' INT8 patch features are subsampled by greedy k-center selection (PatchCore's coreset,
   on a random projection) into the memory bank;
5. the threshold: the held-out good images' scores at the chosen false-reject rate (:func:`choose_threshold`);
   defective images, when given (``bad``: images, in subfolders named by defect type or not), move it down
   to catch those the good images alone would let through, and give AUROC per defect type;
6. with defective images, the supervised route: a logistic-regression head (scikit-learn, at teach time only)
   on the pooled INT8 features, its cross-validated AUROC in the report.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from converters.anomaly import backbone as backbones
from converters.anomaly.backbone import STRIDE
from converters.classifier.core import check_output
from converters.classifier.package import make_manifest, package
from converters.vision import gate
from converters.vision.calib import IMAGE_SUFFIXES, MIN_CALIBRATION
from converters.vision.recipes import Format, QuantScheme, Rounding
from converters.vision.source import Source, SourceKind
from runtime.bundle.manifest import Layout, ModelKind, ResizeMode, VisionSpec, name_from
from runtime.bundle.specs.anomaly import AnomalySpec
from runtime.classify.anomaly import inner, nearest_distances, pooled
from runtime.classify.preprocess import load_rgb, normalize, resize_rgb
from runtime.errors import BadInput, QualityGateFailed

log = logging.getLogger(__name__)
HOLD_OUT_EVERY = 4  # good images 3, 7, 11, ... (25 %) calibrate the threshold and never teach
MIN_HELD_OUT = 4
MAX_IMAGES = 2000  # per set: the features of 2000 images at 128 px are 300 MB of float32
MIN_FEATURE_COSINE = 0.90  # per-patch cosine of INT8 vs float features, mean over the held-out patches
# Input side and the rings of patches left out at the grid's edge, measured on the generated parts
# (scripts/make_parts.py, 96 px images, float features, image AUROC against 40 new good parts):
# * border, at 128 px (16x16 grid), 60 teaching images: scratch/spot/bent_edge 0.62/0.54/0.57 with none,
#   0.66/0.79/0.81 with 1 ring, 0.93/0.98/0.99 with 2: the edge patches see the convolutions' zero padding and
#   belt texture that differs in every image, and scored higher than the defects;
# * size, 30 teaching images, coreset 0.25: scratch 0.87 at 128 px (border 2), 0.95 at 160 (3), 0.94-0.95 at 192
#   (3-4); the rest 0.97-1.0 throughout. 160 px: the thin scratches reach a patch, at 1.6x the cost of 128.
DEFAULT_SIZE = 160
BORDER_FRACTION = 0.15  # of the grid's side, per side: 2 rings at 128 px, 3 at 160, 4 at 192
PROJECTION_DIM = 128  # the coreset's distances are taken on a random projection this wide (PatchCore's)
BATCH = 16


@dataclass(frozen=True)
class Options:
    good: Path
    out: Path
    bad: Path | None = None
    false_reject: float = 0.01
    coreset: float = 0.1
    seed: int = 0
    backbone: str = backbones.DEFAULT_BACKBONE
    size: int = DEFAULT_SIZE
    border: int | None = None  # None: BORDER_FRACTION of the grid
    rounding: Rounding = Rounding.GPTQ
    name: str | None = None
    version: str | None = None


@dataclass(frozen=True)
class Result:
    out: Path
    report: dict[str, Any]


def list_images(folder: Path, what: str) -> list[Path]:
    if not folder.is_dir():
        raise BadInput(f"{what} {folder}: no such directory (give a folder of images)")
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise BadInput(f"{what} {folder}: no images found (looked for {', '.join(IMAGE_SUFFIXES)})")
    if len(files) > MAX_IMAGES:
        raise BadInput(f"{what} {folder}: {len(files)} images; at most {MAX_IMAGES} are read")
    return files


def load_images(files: list[Path], spec: VisionSpec) -> np.ndarray:
    """The images as one float32 batch at model size, each decoded and resized before the next is read: up to
    MAX_IMAGES photos of up to MAX_IMAGE_PIXELS each never sit in memory decoded at once."""
    return normalize(np.stack([resize_rgb(load_rgb(p), spec) for p in files]), spec)


def defect_type(path: Path, root: Path) -> str:
    """A defective image's type: its first subfolder under ``root``, or "bad" for images directly in it."""
    rel = path.relative_to(root)
    return rel.parts[0] if len(rel.parts) > 1 else "bad"


def check_options(opts: Options) -> None:
    if not (isinstance(opts.false_reject, float | int) and 0.0 < opts.false_reject <= 0.5):
        raise BadInput(f"--false-reject {opts.false_reject} must be a rate in (0, 0.5], e.g. 0.01 for 1 %")
    if not (isinstance(opts.coreset, float | int) and 0.0 < opts.coreset <= 1.0):
        raise BadInput(f"--coreset {opts.coreset} must be a fraction in (0, 1], e.g. 0.1 keeps 10 % of the patches")
    if not isinstance(opts.seed, int) or opts.seed < 0:
        raise BadInput(f"--seed {opts.seed} must be a whole number >= 0")
    if opts.size % 16 or not 32 <= opts.size <= 1024:
        raise BadInput(f"size {opts.size} must be a multiple of 16 in 32..1024 (the backbone's stride-16 grid)")
    if opts.border is not None and (not isinstance(opts.border, int) or not 0 <= 2 * opts.border < opts.size // STRIDE):
        raise BadInput(f"border {opts.border} must be 0..{(opts.size // STRIDE - 1) // 2} rings of patches at size {opts.size}")
    backbones.find(opts.backbone)
    check_output(opts.out, None)


def split_good(n: int, every: int = HOLD_OUT_EVERY) -> np.ndarray:
    """Mask of held-out good images: every ``every``-th. Refuses sets too small to teach and calibrate."""
    held = np.arange(n) % every == every - 1
    if n - held.sum() < MIN_CALIBRATION or held.sum() < MIN_HELD_OUT:
        need = next(k for k in range(n, 10_000) if k - k // every >= MIN_CALIBRATION and k // every >= MIN_HELD_OUT)
        raise BadInput(f"{n} good images are too few: {every - 1} in {every} teach (at least {MIN_CALIBRATION}) and "
                       f"1 in {every} calibrate the threshold (at least {MIN_HELD_OUT}); give at least {need}")
    return held


def coreset(x: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Indices of ``ceil(fraction * len(x))`` rows chosen by greedy k-center selection (each next row is the one
    farthest from those chosen so far), on a Johnson-Lindenstrauss projection to PROJECTION_DIM; sorted."""
    n = len(x)
    k = max(1, math.ceil(fraction * n))
    if k >= n:
        return np.arange(n)
    rng = np.random.default_rng(seed)
    z = x
    if x.shape[1] > PROJECTION_DIM:
        z = x @ (rng.standard_normal((x.shape[1], PROJECTION_DIM)).astype(np.float32) / math.sqrt(PROJECTION_DIM))
    z_sq = np.einsum("ij,ij->i", z, z)
    chosen = np.empty(k, dtype=np.int64)
    chosen[0] = rng.integers(n)
    dist = z_sq - 2 * z @ z[chosen[0]] + z_sq[chosen[0]]
    for i in range(1, k):
        chosen[i] = int(dist.argmax())
        np.minimum(dist, z_sq - 2 * z @ z[chosen[i]] + z_sq[chosen[i]], out=dist)
    return np.sort(chosen)


def auroc(negatives: np.ndarray, positives: np.ndarray) -> float | None:
    """Area under the ROC curve of positives scoring above negatives (ties count half); None if either is empty."""
    if not len(negatives) or not len(positives):
        return None
    neg = np.sort(np.asarray(negatives, np.float64))
    pos = np.asarray(positives, np.float64)
    below = np.searchsorted(neg, pos, side="left")
    ties = np.searchsorted(neg, pos, side="right") - below
    return float((below + 0.5 * ties).sum() / (len(neg) * len(pos)))


def choose_threshold(good: np.ndarray, bad: np.ndarray, false_reject: float) -> tuple[float, dict[str, Any]]:
    """The image-score threshold (score >= threshold: anomalous) for ``false_reject`` on held-out ``good`` scores.

    * empirical: just above the good score that leaves at most ``floor(false_reject * n)`` good images at or
      above it;
    * fitted: the (1 - false_reject) quantile of a log-normal fitted to the good scores, which reaches past the
      largest score when n is too small to measure 1 % (n held-out images resolve rates of 1/n);
    * the good images alone give the larger of the two. Defective scores (``bad``) between the empirical and
      that one would be let through: the threshold then moves down to midway between the largest accepted
      good score and the lowest such defect score (still within the false-reject rate on the held-out set).
    """
    from statistics import NormalDist

    s = np.sort(good.astype(np.float64))
    n = len(s)
    allowed = int(math.floor(false_reject * n + 1e-9))
    accepted_max = s[n - allowed - 1]
    # the next float32 above it: scores are float32, and a float64 step above one rounds back to it in a comparison
    empirical = float(np.nextafter(np.float32(accepted_max), np.float32(np.inf)))
    logs = np.log(np.maximum(s, 1e-12))
    fitted = float(np.exp(logs.mean() + NormalDist().inv_cdf(1 - false_reject) * max(logs.std(ddof=1), 1e-6)))
    from_good = max(empirical, fitted)
    threshold, tuned = from_good, False
    caught = bad[(bad >= empirical) & (bad < from_good)] if len(bad) else bad
    if len(caught):
        threshold, tuned = float(max(empirical, (accepted_max + caught.min()) / 2)), True
    return threshold, {"empirical": empirical, "fitted_lognormal": fitted, "from_good": from_good,
                       "tuned_by_bad": tuned, "held_out_good": n, "rejections_allowed": allowed}


def _features(backend: Any, x: np.ndarray) -> np.ndarray:
    """Model inputs -> (N, P, C) float patch features from a backbone opened by converters.vision.gate.open_model."""
    out = [gate.outputs(backend, x[i : i + BATCH]) for i in range(0, len(x), BATCH)]
    y = np.concatenate(out)
    return y.reshape(len(x), -1, backend.output.shape[-1]).astype(np.float32)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a2, b2 = a.reshape(-1, a.shape[-1]).astype(np.float64), b.reshape(-1, b.shape[-1]).astype(np.float64)
    norms = np.linalg.norm(a2, axis=1) * np.linalg.norm(b2, axis=1)
    return np.where(norms > 0, (a2 * b2).sum(1) / np.maximum(norms, 1e-30), 1.0)


def _head(good: np.ndarray, bad: np.ndarray, seed: int) -> tuple[np.ndarray, dict[str, Any]]:
    """Logistic regression on pooled features (good 0, bad 1), standardization folded into its weights: the
    (2C + 1,) float32 head, and its cross-validated AUROC."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict

    x = np.concatenate([good, bad]).astype(np.float64)
    y = np.r_[np.zeros(len(good)), np.ones(len(bad))]
    mean, std = x.mean(0), x.std(0) + 1e-6
    z = (x - mean) / std
    model = LogisticRegression(C=0.1, max_iter=2000, class_weight="balanced")
    folds = min(5, len(good), len(bad))
    cv = None
    if folds >= 2:
        p = cross_val_predict(model, z, y, cv=StratifiedKFold(folds, shuffle=True, random_state=seed), method="predict_proba")[:, 1]
        cv = auroc(p[y == 0], p[y == 1])
    model.fit(z, y)
    w = model.coef_[0] / std
    b = model.intercept_[0] - float((model.coef_[0] * mean / std).sum())
    return np.r_[w, b].astype(np.float32), {"cv_auroc": cv, "cv_folds": folds, "good": len(good), "bad": len(bad)}


def teach(opts: Options) -> Result:
    """Build the anomaly bundle at ``opts.out``; nothing is left there on failure."""
    check_options(opts)
    good_files = list_images(opts.good, "--good")
    bad_files = list_images(opts.bad, "--bad") if opts.bad is not None else []
    held = split_good(len(good_files))
    entry = backbones.find(opts.backbone)
    from converters.vision import zoo

    zoo_entry = zoo.find(entry.name)
    spec = VisionSpec(size=opts.size, layout=Layout.NHWC, resize=ResizeMode.STRETCH, mean=zoo_entry.mean, std=zoo_entry.std,
                      output_is_logits=False)
    good_x = load_images(good_files, spec)
    bad_x = load_images(bad_files, spec) if bad_files else None
    work = Path(tempfile.mkdtemp(dir=opts.out.parent, prefix=f".{opts.out.name}.teach-"))
    try:
        return _teach(opts, entry, zoo_entry, spec, good_files, held, good_x, bad_files, bad_x, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _teach(opts: Options, entry: backbones.Backbone, zoo_entry: Any, spec: VisionSpec, good_files: list[Path], held: np.ndarray,
           good_x: np.ndarray, bad_files: list[Path], bad_x: np.ndarray | None, work: Path) -> Result:
    from converters.classifier.memory import arena_bytes
    from converters.classifier.quantize import build_quantized

    source = Source(SourceKind.TORCH, f"anomaly-{entry.name}", module=backbones.build(entry), size=opts.size,
                    mean=zoo_entry.mean, std=zoo_entry.std, license=zoo_entry.license)
    bundle = work / "bundle"
    bundle.mkdir()
    model_path, float_path = bundle / "model.tflite", work / "float.tflite"
    teach_x, held_x = good_x[~held], good_x[held]
    choice = build_quantized(source, Format.TFLITE, QuantScheme.INT8, teach_x, opts.good, work, model_path, nhwc=True,
                             rounding=opts.rounding)
    with gate.open_model(float_path, "tflite") as ref_model, gate.open_model(model_path, "tflite") as model:
        check_x = held_x if bad_x is None else np.concatenate([held_x, bad_x])
        cos = _cosines(_features(ref_model, check_x), _features(model, check_x))
        feature_gate = {"cosine_mean": float(cos.mean()), "cosine_p01": float(np.quantile(cos, 0.01)),
                        "cosine_min": float(cos.min()), "bound": MIN_FEATURE_COSINE, "patches": int(cos.size),
                        "float_latency_ms": gate.latency_ms(ref_model, check_x),
                        "int8_latency_ms": gate.latency_ms(model, check_x), "cpu": gate.cpu_name()}
        feature_gate["passed"] = feature_gate["cosine_mean"] >= MIN_FEATURE_COSINE
        if not feature_gate["passed"]:
            raise QualityGateFailed(f"feature gate failed: INT8 features' mean cosine similarity to float "
                                    f"{feature_gate['cosine_mean']:.4f} < {MIN_FEATURE_COSINE} over {cos.size} held-out "
                                    "patches; nothing was written. Try more or more varied --good images")
        io = (gate.tensor_quant(model.input), gate.tensor_quant(model.output))
        arena = arena_bytes(model, float_path, "tflite")
        grid, channels = model.output.shape[1], model.output.shape[-1]
        teach_f = _features(model, teach_x)
        held_f = _features(model, held_x)
        bad_f = _features(model, bad_x) if bad_x is not None else None
    if grid != opts.size // STRIDE or channels != entry.channels:
        raise BadInput(f"the backbone gives a {grid}x{grid}x{channels} grid, expected {opts.size // STRIDE}x{opts.size // STRIDE}"
                       f"x{entry.channels}")
    border = opts.border if opts.border is not None else round(BORDER_FRACTION * grid)
    keep = inner(grid, border)
    teach_f, held_f = teach_f[:, keep], held_f[:, keep]
    bad_f = bad_f[:, keep] if bad_f is not None else None
    patches = teach_f.reshape(-1, channels)
    bank = np.ascontiguousarray(patches[coreset(patches, opts.coreset, opts.seed)], dtype=np.float32)
    bank_sq = np.einsum("ij,ij->i", bank, bank)

    def image_scores(f: np.ndarray) -> np.ndarray:
        return nearest_distances(f.reshape(-1, channels), bank, bank_sq).reshape(len(f), -1).max(1)

    good_s = image_scores(held_f)
    bad_s = image_scores(bad_f) if bad_f is not None else np.zeros(0, np.float32)
    threshold, how = choose_threshold(good_s, bad_s, opts.false_reject)
    types = [defect_type(p, opts.bad) for p in bad_files] if opts.bad is not None else []
    per_type = {}
    for t in sorted(set(types)):
        s = bad_s[np.array(types) == t]
        per_type[t] = {"images": len(s), "auroc": auroc(good_s, s), "missed": float((s < threshold).mean())}
    files: list[tuple[str, Path]] = [("weights", model_path)]
    np.save(bundle / "bank.npy", bank)
    files.append(("bank", bundle / "bank.npy"))
    head_name, head_report = None, None
    if bad_f is not None:
        good_all = np.concatenate([teach_f, held_f])
        head, head_report = _head(pooled(good_all), pooled(bad_f), opts.seed)
        np.save(bundle / "head.npy", head)
        files.append(("head", bundle / "head.npy"))
        head_name = "head.npy"
    report = {
        "backbone": entry.name, "layers": f"blocks {entry.layer2} and {entry.layer3} (stride 8 and 16), 3x3 average, concatenated",
        "size": opts.size, "grid": grid, "border": border, "channels": channels,
        "good_images": len(good_files), "teach_images": int((~held).sum()), "held_out_good": int(held.sum()),
        "bad_images": len(bad_files), "patches": int(len(patches)), "bank_rows": int(len(bank)), "coreset": opts.coreset,
        "seed": opts.seed, "recipe": choice.quant.value, "rounding": choice.rounding, "feature_gate": feature_gate,
        "threshold": threshold, "threshold_choice": how,
        "false_reject": {"chosen": opts.false_reject, "measured_held_out": float((good_s >= threshold).mean()),
                         "resolution": 1 / len(good_s),
                         "note": f"measured on {len(good_s)} held-out good images, which resolve rates of 1/{len(good_s)}"},
        "good_scores": {"min": float(good_s.min()), "median": float(np.median(good_s)), "max": float(good_s.max())},
        "auroc": auroc(good_s, bad_s) if len(bad_s) else None,
        "missed_defects": float((bad_s < threshold).mean()) if len(bad_s) else None,
        "defect_types": per_type, "head": head_report,
    }
    (bundle / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    files.append(("report", bundle / "report.json"))
    anomaly = AnomalySpec(backbone=entry.name, grid=grid, channels=channels, bank="bank.npy", bank_rows=len(bank),
                          bank_dtype="float32", threshold=threshold, false_reject=opts.false_reject, coreset=opts.coreset,
                          head=head_name, border=border)
    vision = replace(spec, input=io[0], output=io[1], quantization=choice.quant.value, arena_bytes=arena)
    digest = hashlib.sha256(bank.tobytes() + np.float64(threshold).tobytes()).hexdigest()[:12]
    manifest = make_manifest(ModelKind.ANOMALY, Format.TFLITE, opts.name or name_from(opts.out.name.removesuffix(".edgerun")),
                             opts.version or f"int8-{digest}", files, source,
                             {"model": f"zoo:{entry.name}", "calibration": str(opts.good)}, report, vision=vision, anomaly=anomaly)
    manifest = replace(manifest, reports={"teach": report})
    package(bundle, manifest, opts.out)
    return Result(opts.out, report)
