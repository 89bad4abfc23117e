"""Audio calibration and evaluation sets: a folder of WAVs through the bundle's own front end, or an .npz of ready windows.

Every file is read and resampled to the model's rate and cut into the windows the runtime will feed
(:mod:`runtime.classify.audio_frontend`); WAVs in subfolders are labelled by the subfolder's name. Without ``--eval``, every fifth
file goes to the gate whole (:func:`hold_out`), and a labelled file is judged by its best window
(:func:`clip_accuracy`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from converters.vision.calib import HOLD_OUT_EVERY, MIN_CALIBRATION
from runtime.classify.audio_frontend import load_audio, wav_files
from runtime.errors import BadInput


@dataclass(frozen=True)
class ClipSet:
    x: np.ndarray  # model inputs, one row per window
    clip: np.ndarray | None  # which file each window came from (None for an .npz)
    labels: np.ndarray | None  # per file: class index (detectors: 1 = the word, 0 = anything else), -1 unknown


def clip_set(folder: Path, frontend: Any, rate: int, label_names: list[str] | None = None, limit: int | None = None) -> ClipSet:
    """Model inputs from a folder of WAVs (every window of every file, evenly thinned to ``limit``) or an .npz ``x``.

    WAVs in subfolders are labelled by the subfolder's name: a class name from the labels, or for a one-label
    detector its label (the word is said) or any other name (it is not)."""
    if not folder.exists():
        raise BadInput(f"{folder}: no such calibration/evaluation folder or .npz file")
    clip = labels = None
    if folder.is_file():
        if folder.suffix != ".npz":
            raise BadInput(f"{folder}: give a folder of .wav files or an .npz with an array 'x' of model inputs")
        try:
            with np.load(folder, allow_pickle=False) as data:
                x = np.asarray(data["x"], np.float32)
        except (KeyError, ValueError, OSError) as exc:
            raise BadInput(f"{folder}: not an .npz with an array 'x' ({exc})") from None
    else:
        files = wav_files(folder)
        if not files:
            raise BadInput(f"{folder}: no .wav files (calibration and evaluation sets are folders of WAV files)")
        parts = [frontend.windows(load_audio(f, rate).samples, rate).x for f in files]
        x = np.concatenate(parts)
        clip = np.repeat(np.arange(len(files)), [len(p) for p in parts])
        labels = np.array([_clip_label(f, folder, label_names) for f in files])
    want = tuple(frontend.input_shape)
    if x.ndim < 2 or tuple(x.shape[1:]) != want:
        raise BadInput(f"{folder}: inputs have shape {x.shape[1:]}, the model takes {want}")
    if not np.isfinite(x).all():
        raise BadInput(f"{folder}: inputs contain NaN or infinity")
    if limit is not None and len(x) > limit:
        keep = np.linspace(0, len(x) - 1, limit).round().astype(int)
        x, clip = x[keep], None if clip is None else clip[keep]
    return ClipSet(np.ascontiguousarray(x), clip, labels)


def _clip_label(path: Path, root: Path, names: list[str] | None) -> int:
    if path.parent == root or not names:
        return -1
    name = path.relative_to(root).parts[0]
    if len(names) == 1:
        return int(name == names[0])
    return names.index(name) if name in names else -1


def windows(folder: Path, frontend: Any, rate: int, limit: int | None = None) -> np.ndarray:
    return clip_set(folder, frontend, rate, limit=limit).x


def hold_out(cal: ClipSet, every: int = HOLD_OUT_EVERY) -> tuple[np.ndarray, ClipSet]:
    """(calibration windows, evaluation set) with no --eval: every ``every``-th file goes to evaluation whole (its
    windows overlap, so holding out single windows would score what calibrated), or every ``every``-th window of
    an .npz, or of a folder with too few files to spare one."""
    held = None
    if cal.clip is not None and cal.clip.max() + 1 >= every:
        held = cal.clip % every == every - 1
    if held is None or len(cal.x) - held.sum() < MIN_CALIBRATION:
        held = np.arange(len(cal.x)) % every == every - 1
    if len(cal.x) - held.sum() < MIN_CALIBRATION:
        raise BadInput(
            f"{len(cal.x)} calibration windows are too few to hold {100 // every} % out for the accuracy gate; "
            "give more audio, or an evaluation set with --eval"
        )
    return np.ascontiguousarray(cal.x[~held]), ClipSet(np.ascontiguousarray(cal.x[held]), None, None)


def clip_accuracy(ev: ClipSet, scores: np.ndarray, threshold: float) -> float | None:
    """Labelled files classified right: a detector's best window against the threshold, else the best class over windows."""
    if ev.clip is None or ev.labels is None or not (ev.labels >= 0).any():
        return None
    right = []
    for i, label in enumerate(ev.labels):
        if label < 0:
            continue
        best = scores[ev.clip == i].max(axis=0)
        got = int(best[0] >= threshold) if scores.shape[1] == 1 else int(best.argmax())
        right.append(got == label)
    return float(np.mean(right))
