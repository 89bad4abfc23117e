"""Audio classifiers and detectors from audio bundles: WAV files in, labels and scores out.

Each file is read and resampled to the bundle's rate (:mod:`runtime.classify.audio_frontend`),
cut into windows by the bundle's front end, and every window is classified; a
file's result is its best window (the highest score of each class over the
file) and where it ends; long files go a segment at a time
(:meth:`AudioClassifier.segments`). A one-output model is a detector (wake
word, voice activity): its score is a probability and ``detected`` compares it
with the manifest's threshold.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime.backends.base import ClassifierBackend
from runtime.bundle.manifest import Manifest, ModelKind
from runtime.bundle.resolve import ResolvedModel
from runtime.bundle.specs.audio import AudioSpec
from runtime.classify import preprocess
from runtime.classify.audio_frontend import Audio, FrontEnd, WavInfo, load_audio, open_frontend, reading_bytes
from runtime.classify.classifier import check_quant, load_classifier, takes, time_calls
from runtime.classify.plan import ClassifierPlan, plan_classifier
from runtime.errors import BadInput

log = logging.getLogger(__name__)
# Long files are classified a segment at a time, each with the audio just before it as context (one openWakeWord
# window is 1.98 s), so a 10-minute recording needs no more working memory than 30 s (see the memory plan).
SEGMENT_SECONDS, CONTEXT_SECONDS = 30.0, 2.0


SEGMENT_PADDED_SECONDS = SEGMENT_SECONDS + CONTEXT_SECONDS + 2.5  # + the front end's padding
SEGMENT_WINDOWS = int(SEGMENT_PADDED_SECONDS / 0.08) + 1  # the most windows one segment gives (openWakeWord: every 80 ms)


def segment_bytes(spec: AudioSpec) -> int:
    """Working memory of one segment: its samples with context and padding (three float copies) and its windows."""
    return int(SEGMENT_PADDED_SECONDS * spec.sample_rate * 4 * 3) + SEGMENT_WINDOWS * int(np.prod(spec.input_shape)) * 4


@dataclass(frozen=True)
class AudioPrediction:
    source: str
    seconds: float
    labels: tuple[preprocess.Label, ...]  # best first, each class's best window
    at_seconds: float  # where the best window of the top label ends
    detected: bool | None  # detectors: top score >= threshold; None for multi-class models
    resampled_from: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"input": self.source, "seconds": round(self.seconds, 3), "labels": [lab.to_dict() for lab in self.labels],
                "at_seconds": round(self.at_seconds, 3), "detected": self.detected, "resampled_from": self.resampled_from}


class AudioClassifier:
    def __init__(self, model: ResolvedModel, backend: ClassifierBackend, frontend: Any, placement: Any, plan: ClassifierPlan,
                 labels: list[str]) -> None:
        self.model, self.backend, self.frontend, self.placement, self.plan = model, backend, frontend, placement, plan
        spec = model.manifest.audio
        assert spec is not None
        self.spec: AudioSpec = spec
        self.labels = labels
        i, o = backend.input, backend.output
        check_quant(model.manifest.ref, "input", spec.input, i.dtype, i.scale, i.zero_point)
        check_quant(model.manifest.ref, "output", spec.output, o.dtype, o.scale, o.zero_point)
        if not takes(i.shape[1:], spec.input_shape):
            want = ', '.join(map(str, spec.input_shape))
            raise BadInput(f"{model.manifest.ref}: the model takes {i.shape}, the manifest says (N, {want})")

    @classmethod
    def load(cls, ref: str, *, threads: int | None = None, target: str = "auto", require_accelerator: bool = False,
             memory: int | None = None, batch: int = 1, resident_bytes: int = 0, busy_threads: int = 0,
             input_bytes: int = 0, inputs: Sequence[WavInfo] = ()) -> AudioClassifier:
        """``inputs``: the checked headers of the files to classify, when known: the plan counts reading them
        (:func:`runtime.classify.audio_frontend.reading_bytes`: every clip at the model's rate, one block and one resampling chunk);
        ``input_bytes``: any other input memory to count. ``resident_bytes``, ``busy_threads``: the memory and the
        CPU threads of models already resident in this process (a llama.cpp model's); ORT's threads, the front end's
        included, do not spin beside busy ones."""
        from runtime.llm.plan import default_budget

        def plan(manifest: Manifest) -> ClassifierPlan:
            spec = manifest.audio
            assert spec is not None
            sizes = {f.path: f.size for f in manifest.files}  # verified: each file is this size
            weights = manifest.file("weights").size + sum(sizes[name] for name in spec.frontend_files)
            # the model's batch is a segment's windows, whatever the number of files
            return plan_classifier(manifest, weights, memory or default_budget(), batch=SEGMENT_WINDOWS,
                                   resident_bytes=resident_bytes,
                                   input_bytes=input_bytes + reading_bytes(inputs, spec.sample_rate) + segment_bytes(spec))

        def open_extra(model: ResolvedModel, placement: Any) -> Any:  # the front end, on the verified files
            from devices.backends import BackendName
            from devices.placement import cpu_placement

            spec = model.manifest.audio
            assert spec is not None
            # its models run on the CPU beside the classifier, with the classifier's threads, CPU and core sharing
            beside = cpu_placement(BackendName.ORT, placement.threads, shares_cores=placement.shares_cores, cpu=placement.cpu)
            return model.load(lambda files: open_frontend(FrontEnd(spec.frontend), files, spec.input_shape, beside),
                              *spec.frontend_files)

        return load_classifier(
            ref, ModelKind.AUDIO, ", not an audio one", plan=plan, open_extra=open_extra,
            build=lambda model, backend, placement, plan, labels, frontend: cls(model, backend, frontend, placement, plan, labels),
            threads=threads, target=target, require_accelerator=require_accelerator, busy_threads=busy_threads)

    @property
    def is_detector(self) -> bool:
        return int(np.prod(self.backend.output.shape[1:])) == 1

    def scores(self, x: np.ndarray) -> np.ndarray:
        """Front-end windows (float) -> scores, one row per window."""
        raw = self.backend.run(preprocess.quantize(x, self.spec.input))
        y = preprocess.dequantize(raw, self.spec.output).reshape(len(x), -1)
        return preprocess.softmax(y) if self.spec.output_is_logits else y

    def segments(self, audio: Audio) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(scores, window ends in seconds) for ``audio``, SEGMENT_SECONDS at a time: each segment is given
        CONTEXT_SECONDS of the audio before it, and keeps the windows that end inside it, so the result is the
        same as for the whole clip at once while memory stays bounded by one segment."""
        rate, x = audio.rate, audio.samples
        seg, ctx = int(SEGMENT_SECONDS * rate), int(CONTEXT_SECONDS * rate)
        for start in range(0, max(len(x), 1), seg):
            lo = max(0, start - ctx)
            last = start + seg >= len(x)
            w = self.frontend.windows(x[lo : start + seg], rate)
            ends = w.ends + lo / rate
            keep = ends >= start / rate if start else np.ones(len(ends), bool)
            if not last:
                keep &= ends < (start + seg) / rate
            if keep.any():
                yield self.scores(w.x[keep]), ends[keep]

    def classify(self, audio: Audio, name: str, k: int) -> AudioPrediction:
        parts = list(self.segments(audio))
        scores, ends = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        best = scores.max(axis=0)
        labels = tuple(preprocess.top_k(best, self.labels, k))
        at = float(ends[int(scores[:, labels[0].index].argmax())])
        detected = bool(best[0] >= self.spec.threshold) if self.is_detector else None
        return AudioPrediction(name, audio.seconds, labels, at, detected, audio.resampled_from)

    def classify_files(self, paths: list[Path | str], k: int) -> list[AudioPrediction]:
        clips = [load_audio(p, self.spec.sample_rate) for p in paths]  # every file reads before any runs
        for p, clip in zip(paths, clips, strict=True):
            if clip.resampled_from:
                log.warning("%s: resampled from %d Hz to the model's %d Hz", p, clip.resampled_from, clip.rate)
        return [self.classify(clip, str(p), k) for p, clip in zip(paths, clips, strict=True)]

    def latency(self, x: np.ndarray, runs: int, warmup: int = 3) -> list[float]:
        return time_calls(self.backend, x, runs, warmup)

    def close(self) -> None:
        self.backend.close()
        self.frontend.close()

    def __enter__(self) -> AudioClassifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
