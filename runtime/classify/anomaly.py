"""Anomaly detection from ``anomaly`` bundles (PatchCore-style): patch features, nearest-neighbour distance to a bank.

The bundle's backbone (an INT8 feature model, loaded through runtime.backends like any classifier) turns an
image into a ``grid`` x ``grid`` grid of patch features; each patch's score is its Euclidean distance to the
nearest of the memory bank's good-part patches, and the image's score is its largest patch score. A part
scoring at or above the manifest's ``threshold`` is anomalous. The ``border`` rings of patches at the grid's edge
are left out (score 0): their receptive fields run into the convolutions' zero padding, and on a part centred in
the frame they see only the belt, so with few teaching images they scored higher than any defect. The heat map is the patch scores upsampled
(bilinear) to the image's own size, divided by twice the threshold and clipped to 0..1: 0.5 is the threshold.
A bundle taught with defective images also carries a logistic-regression head on the pooled features (mean
and max over the patches); :meth:`AnomalyDetector.detect` reports its probability beside the score.

The distance search is numpy, chunked so that no intermediate is larger than :data:`CHUNK_BYTES`; the plan
(runtime.classify.plan) counts the bank and that working set beside the backbone.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime.bundle.manifest import Manifest, ModelKind
from runtime.bundle.resolve import ResolvedModel, resolve
from runtime.bundle.specs.anomaly import AnomalySpec
from runtime.classify import preprocess
from runtime.classify.plan import ClassifierPlan, plan_classifier
from runtime.errors import BadInput

log = logging.getLogger(__name__)
CHUNK_BYTES = 16 << 20  # the largest distance block (patches x bank rows, float32) computed at once
_BLAS: list[Any] = []  # threadpoolctl's controller, made once (it scans the loaded libraries)


def one_blas_thread() -> contextlib.AbstractContextManager[Any]:
    """BLAS on one thread for the distance search, where threadpoolctl is installed. The products are small (an
    image's 200 patches against a bank of hundreds to thousands): OpenBLAS's threads spinning beside the backend's
    made one image's search take 6.5-32 ms on the 2-core test machine under load, 0.8 ms on one thread."""
    if not _BLAS:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:
            _BLAS.append(None)
        else:
            _BLAS.append(ThreadpoolController())
    return contextlib.nullcontext() if _BLAS[0] is None else _BLAS[0].limit(limits=1, user_api="blas")


@dataclass(frozen=True)
class Detection:
    score: float  # image score: the largest patch distance to the bank
    anomalous: bool  # score >= threshold
    heatmap: np.ndarray  # HxW float32 in 0..1 at the image's size; 0.5 is the threshold
    head_probability: float | None = None  # the supervised head's P(defective), when the bundle has one

    def to_dict(self) -> dict[str, Any]:
        return {"score": self.score, "anomalous": self.anomalous, "head_probability": self.head_probability}


def working_bytes(spec: AnomalySpec, batch: int) -> int:
    """Memory the scoring needs beside the backbone: the bank (float32) with its squared norms, one distance
    chunk, and a batch's patch features and their scores."""
    patches = batch * spec.grid * spec.grid
    return spec.bank_bytes + spec.bank_rows * 4 + CHUNK_BYTES + patches * (spec.channels + 2) * 4


def plan_anomaly(manifest: Manifest, budget: int, *, batch: int = 1, resident_bytes: int = 0) -> ClassifierPlan:
    """The backbone's plan (weights, arena, runtime) with the bank and the distance search as its inputs' bytes."""
    spec = _spec(manifest)
    weights = sum(f.size for f in manifest.files if f.role in ("weights", "head"))
    return plan_classifier(manifest, weights, budget, batch=batch, resident_bytes=resident_bytes,
                           input_bytes=working_bytes(spec, batch))


def _spec(manifest: Manifest) -> AnomalySpec:
    if manifest.kind is not ModelKind.ANOMALY or manifest.anomaly is None or manifest.vision is None:
        raise BadInput(f"{manifest.ref} is a {manifest.kind.value} bundle; AnomalyDetector takes anomaly bundles "
                       "(edgerun kiosk teach makes them)")
    return manifest.anomaly


def nearest_distances(patches: np.ndarray, bank: np.ndarray, bank_sq: np.ndarray | None = None) -> np.ndarray:
    """Each row of ``patches`` (P, C) -> its Euclidean distance to the nearest row of ``bank`` (M, C), float32.
    Computed as |p|^2 + |m|^2 - 2 p.m over blocks of at most CHUNK_BYTES."""
    patches = np.ascontiguousarray(patches, dtype=np.float32)
    if bank_sq is None:
        bank_sq = np.einsum("ij,ij->i", bank, bank)
    p_sq = np.einsum("ij,ij->i", patches, patches)
    best = np.full(len(patches), np.inf, np.float32)
    rows = max(1, CHUNK_BYTES // (4 * max(len(bank), 1)))
    cols = max(1, CHUNK_BYTES // (4 * max(min(rows, len(patches)), 1)))
    for i in range(0, len(patches), rows):
        p = patches[i : i + rows]
        for j in range(0, len(bank), cols):
            d = bank_sq[None, j : j + cols] - 2.0 * (p @ bank[j : j + cols].T)
            np.minimum(best[i : i + rows], d.min(1), out=best[i : i + rows])
    return np.sqrt(np.maximum(best + p_sq, 0.0)).astype(np.float32)


def upsample(grid: np.ndarray, height: int, width: int) -> np.ndarray:
    """A (h, w) map -> (height, width), bilinear with pixel centres aligned (as cv2.resize INTER_LINEAR)."""
    h, w = grid.shape

    def axis(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        pos = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
        lo = np.floor(pos).astype(int)
        hi = np.minimum(lo + 1, n_in - 1)
        return lo, hi, (pos - lo).astype(np.float32)

    y0, y1, fy = axis(h, height)
    x0, x1, fx = axis(w, width)
    rows = grid[y0] * (1 - fy)[:, None] + grid[y1] * fy[:, None]
    return (rows[:, x0] * (1 - fx) + rows[:, x1] * fx).astype(np.float32)


def inner(grid: int, border: int) -> np.ndarray:
    """Indices of the patches of a ``grid`` x ``grid`` grid (row-major) that lie ``border`` rings or more inside it."""
    keep = np.zeros((grid, grid), bool)
    keep[border : grid - border, border : grid - border] = True
    return np.flatnonzero(keep)


def pooled(features: np.ndarray) -> np.ndarray:
    """(N, P, C) patch features -> (N, 2C): mean and max over the patches (the supervised head's input)."""
    return np.concatenate([features.mean(1), features.max(1)], 1)


def load_bank(path: Path, spec: AnomalySpec, ref: str) -> np.ndarray:
    try:
        bank = np.load(path, allow_pickle=False)
    except Exception as exc:
        raise BadInput(f"{ref}: memory bank {spec.bank} is not a readable .npy ({type(exc).__name__}: {exc})"[:300]) from None
    if bank.shape != (spec.bank_rows, spec.channels) or bank.dtype != np.dtype(spec.bank_dtype):
        raise BadInput(f"{ref}: memory bank {spec.bank} is {bank.dtype} {bank.shape}, the manifest says "
                       f"{spec.bank_dtype} ({spec.bank_rows}, {spec.channels})")
    bank = bank.astype(np.float32)
    if not np.isfinite(bank).all():
        raise BadInput(f"{ref}: memory bank {spec.bank} holds NaN or infinity")
    return bank


def load_head(path: Path, spec: AnomalySpec, ref: str) -> np.ndarray:
    try:
        head = np.load(path, allow_pickle=False)
    except Exception as exc:
        raise BadInput(f"{ref}: head {spec.head} is not a readable .npy ({type(exc).__name__}: {exc})"[:300]) from None
    if head.shape != (2 * spec.channels + 1,) or head.dtype != np.float32 or not np.isfinite(head).all():
        raise BadInput(f"{ref}: head {spec.head} must be {2 * spec.channels + 1} finite float32 values "
                       f"(2 x {spec.channels} weights and a bias), got {head.dtype} {head.shape}")
    return head


class AnomalyDetector:
    def __init__(self, model: ResolvedModel, backend: Any, placement: Any, plan: ClassifierPlan, bank: np.ndarray,
                 head: np.ndarray | None) -> None:
        from runtime.classify.classifier import check_quant

        manifest = model.manifest
        self.model, self.backend, self.placement, self.plan = model, backend, placement, plan
        self.spec, self.vision = _spec(manifest), manifest.vision
        assert self.vision is not None
        self.bank, self.head = bank, head
        self.bank_sq = np.einsum("ij,ij->i", bank, bank)
        i, o = backend.input, backend.output
        check_quant(manifest.ref, "input", self.vision.input, i.dtype, i.scale, i.zero_point)
        check_quant(manifest.ref, "output", self.vision.output, o.dtype, o.scale, o.zero_point)
        size, grid, channels = self.vision.size, self.spec.grid, self.spec.channels
        want_in = (3, size, size) if self.vision.layout.value == "nchw" else (size, size, 3)
        if tuple(i.shape[1:]) != want_in or tuple(o.shape[1:]) != (grid, grid, channels):
            raise BadInput(f"{manifest.ref}: the backbone takes {i.shape} and gives {o.shape}; the manifest says "
                           f"(N, {', '.join(map(str, want_in))}) -> (N, {grid}, {grid}, {channels})")

    @classmethod
    def load(cls, ref: str, *, threads: int | None = None, target: str = "auto", require_accelerator: bool = False,
             memory: int | None = None, batch: int = 1, resident_bytes: int = 0, busy_threads: int = 0) -> AnomalyDetector:
        """Resolve and verify the bundle, plan it (backbone + bank, refused before anything opens), resolve the
        placement, read the bank and head, open the backbone's backend on its verified weights."""
        from devices.placement import resolve_placement
        from runtime.classify.classifier import open_backend
        from runtime.llm.plan import default_budget

        model = resolve(ref)
        manifest = model.manifest
        spec = _spec(manifest)
        plan = plan_anomaly(manifest, memory or default_budget(), batch=batch, resident_bytes=resident_bytes)
        placement = resolve_placement(manifest.backend.value, target, require_accelerator=require_accelerator, threads=threads,
                                      int8=manifest.vision.quantization == "int8", busy_threads=busy_threads)  # type: ignore[union-attr]
        with model.opened(spec.bank) as (path,):
            bank = load_bank(path, spec, manifest.ref)
        head = None
        if spec.head:
            with model.opened(spec.head) as (path,):
                head = load_head(path, spec, manifest.ref)
        with contextlib.ExitStack() as undo:
            backend = open_backend(model, plan, placement)
            undo.callback(backend.close)
            placement = placement.loaded(backend.offload(), require_accelerator=require_accelerator)
            log.info("%s", placement.summary())
            detector = cls(model, backend, placement, plan, bank, head)
            undo.pop_all()
        return detector

    @property
    def threshold(self) -> float:
        return self.spec.threshold

    def features(self, images: list[np.ndarray]) -> np.ndarray:
        """Images -> (N, grid*grid, channels) float32 patch features, as the backbone gives them."""
        x = preprocess.image_tensor(images, self.vision)  # type: ignore[arg-type]
        raw = self.backend.run(preprocess.quantize(x, self.vision.input))  # type: ignore[union-attr]
        y = preprocess.dequantize(raw, self.vision.output)  # type: ignore[union-attr]
        return y.reshape(len(images), self.spec.grid * self.spec.grid, self.spec.channels)

    def patch_scores(self, features: np.ndarray) -> np.ndarray:
        """(N, P, C) features -> (N, P) distances to the nearest bank patch; 0 for the border's patches."""
        n, p, c = features.shape
        inside = inner(self.spec.grid, self.spec.border)
        out = np.zeros((n, p), np.float32)
        with one_blas_thread():
            out[:, inside] = nearest_distances(features[:, inside].reshape(-1, c), self.bank, self.bank_sq).reshape(n, -1)
        return out

    def detect(self, images: list[np.ndarray]) -> list[Detection]:
        if not images:
            raise BadInput("no images to score")
        feats = self.features(images)
        scores = self.patch_scores(feats)
        probs = self.head_probabilities(feats[:, inner(self.spec.grid, self.spec.border)]) if self.head is not None else None
        out = []
        g = self.spec.grid
        for k, img in enumerate(images):
            score = float(scores[k].max())
            heat = upsample(scores[k].reshape(g, g), img.shape[0], img.shape[1])
            heat = np.clip(heat / (2.0 * self.threshold), 0.0, 1.0, out=heat)
            out.append(Detection(score, score >= self.threshold, heat, None if probs is None else float(probs[k])))
        return out

    def score(self, images: list[np.ndarray]) -> list[tuple[float, np.ndarray]]:
        """(image score, heat map HxW float32 0..1) per image, batched through the backbone."""
        return [(d.score, d.heatmap) for d in self.detect(images)]

    def head_probabilities(self, features: np.ndarray) -> np.ndarray:
        assert self.head is not None
        z = pooled(features) @ self.head[:-1] + self.head[-1]
        return 1.0 / (1.0 + np.exp(-np.clip(z, -60, 60)))

    def detect_files(self, paths: list[Path | str]) -> list[Detection]:
        return self.detect([preprocess.load_rgb(p) for p in paths])

    def close(self) -> None:
        self.backend.close()

    def __enter__(self) -> AnomalyDetector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
