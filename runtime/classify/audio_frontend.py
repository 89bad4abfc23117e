"""Audio in: WAV files -> samples at the model's rate -> the model's feature front end -> model inputs.

WAV files are read by :mod:`runtime.formats.wav` (PCM 8/16/24/32-bit, any channel
count, mixed down to mono; checked before anything else sees them) a block at a
time, and a file at another sample rate is resampled on the way
(:mod:`runtime.speech.resample`, band-limited, in bounded chunks), so reading holds the
clip at the model's rate and a fixed working set, never the file's samples in
float (:func:`reading_bytes` is what the memory plan counts). The result says
when it was resampled.

Front ends (``AudioSpec.frontend``) turn samples into the classifier's input
windows, one row per position in the audio:

* ``openwakeword``: openWakeWord's shared front end, two float ONNX models
  shipped in the bundle: a mel spectrogram (32 bins, 10 ms hop, scaled
  ``x / 10 + 2`` as openWakeWord does) and Google's speech embedding over 76
  mel frames every 8 frames (96 values). A classifier input is 16 consecutive
  embeddings (1.28 s of features from ~2 s of audio); positions step by one
  embedding (80 ms). The clip is padded with one window of silence in front and
  half a second behind, so every moment of it ends some window.
* ``waveform``: the model takes raw samples (-1..1); a window is the model's
  input length and positions step by half a window.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime.errors import BadInput
from runtime.formats.wav import MAX_SECONDS, WavInfo, WavReader, wav_info, write_wav
from runtime.speech.resample import output_length, resample, resample_into
from runtime.speech.resample import working_bytes as resample_working_bytes

__all__ = ["MAX_SECONDS", "Audio", "FrontEnd", "WavInfo", "load_audio", "read_wav", "reading_bytes", "resample",
           "wav_files", "wav_info", "write_wav"]
WAV_SUFFIXES = (".wav", ".wave")


class FrontEnd(str, enum.Enum):
    OPENWAKEWORD = "openwakeword"
    WAVEFORM = "waveform"


# openWakeWord's feature geometry (openwakeword/utils.py: AudioFeatures)
OWW_MEL_WINDOW, OWW_MEL_STEP, OWW_EMBEDDINGS, OWW_EMBEDDING_SIZE = 76, 8, 16, 96
OWW_HOP_SAMPLES, OWW_FFT_SAMPLES = 160, 512
OWW_TAIL_SECONDS = 0.5
# Bounded work per native call (memory planning counts these): 10 s of audio per mel call, 64 embedding windows per batch
OWW_MEL_CHUNK_FRAMES, OWW_EMBEDDING_BATCH = 1000, 16
OWW_MIN_SAMPLES = (OWW_MEL_WINDOW + (OWW_EMBEDDINGS - 1) * OWW_MEL_STEP - 1) * OWW_HOP_SAMPLES + OWW_FFT_SAMPLES


@dataclass(frozen=True)
class Audio:
    samples: np.ndarray  # float32 mono, -1..1
    rate: int
    resampled_from: int | None = None  # the file's own rate when it was resampled

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.rate


def clip_bytes(info: WavInfo, rate: int) -> int:
    """The clip that :func:`load_audio` returns: float32 samples at ``rate``."""
    return 4 * (info.frames if info.rate == rate else output_length(info.frames, info.rate, rate))


def reading_bytes(infos: Sequence[WavInfo], rate: int) -> int:
    """Memory to read ``infos`` for a model at ``rate`` Hz when every clip is read before any is classified: all the
    clips at that rate, plus the largest working set of decoding (one block) and resampling (one chunk)."""
    if not infos:
        return 0
    work = max(i.block_working_bytes + resample_working_bytes(i.rate, rate) for i in infos)
    return sum(clip_bytes(i, rate) for i in infos) + work


def read_wav(path: Path | str) -> tuple[np.ndarray, int]:
    """Mono float32 samples in -1..1 and the file's sample rate."""
    with WavReader(path) as wav:
        out = np.empty(wav.info.frames, np.float32)
        _fill(out, wav.blocks())
        return out, wav.info.rate


def _fill(out: np.ndarray, blocks: Any) -> None:
    at = 0
    for block in blocks:
        out[at : at + len(block)] = block
        at += len(block)


def load_audio(path: Path | str, rate: int) -> Audio:
    """The file's samples at ``rate`` Hz, resampled block by block when the file has another rate."""
    with WavReader(path) as wav:
        info = wav.info
        out = np.empty(clip_bytes(info, rate) // 4, np.float32)
        if info.rate == rate:
            _fill(out, wav.blocks())
            return Audio(out, rate)
        resample_into(wav.blocks(), info.rate, rate, out)
    np.clip(out, -1.0, 1.0, out=out)
    return Audio(out, rate, resampled_from=info.rate)


def wav_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in WAV_SUFFIXES)


@dataclass(frozen=True)
class Windows:
    x: np.ndarray  # float32 model inputs, one row per position
    ends: np.ndarray  # seconds: where each window ends in the audio


class OpenWakeWordFrontEnd:
    """Mel spectrogram + speech embedding (float ONNX models, run by ONNX Runtime)."""

    input_shape = (OWW_EMBEDDINGS, OWW_EMBEDDING_SIZE)

    def __init__(self, mel: Path, embedding: Path, placement: Any = None) -> None:
        """``placement``: the CPU placement its ONNX Runtime sessions are told (devices.placement.cpu_placement;
        default one thread on this CPU). Beside a placed classifier it has that one's threads, and its idle threads
        do not spin when the classifier's placement shares cores with other work."""
        from runtime.backends.ort import ORTBackend

        if placement is None:
            from devices.backends import BackendName
            from devices.placement import cpu_placement

            placement = cpu_placement(BackendName.ORT)
        self._mel = ORTBackend(mel, None, placement)
        try:
            self._embedding = ORTBackend(embedding, None, placement)
        except BaseException:
            self._mel.close()
            raise
        if self._embedding.input.shape[1:] != (OWW_MEL_WINDOW, 32, 1) or self._embedding.output.shape[-1] != OWW_EMBEDDING_SIZE:
            self.close()
            raise BadInput(f"{embedding}: not openWakeWord's speech embedding model (input {self._embedding.input.shape}, "
                           f"output {self._embedding.output.shape}; expected (N, 76, 32, 1) -> (N, 1, 1, 96))")

    def windows(self, samples: np.ndarray, rate: int) -> Windows:
        # Silence around the clip, so that every moment of it, the first word and the last, gets to be the end of a window
        # (where openWakeWord's heads look for the word): one window's worth in front, OWW_TAIL_SECONDS behind.
        front = OWW_MIN_SAMPLES
        samples = np.concatenate([np.zeros(front, np.float32), samples, np.zeros(int(OWW_TAIL_SECONDS * rate), np.float32)])
        mel = self.features(samples)
        starts = range(0, len(mel) - OWW_MEL_WINDOW + 1, OWW_MEL_STEP)
        emb = self.embed(mel, starts)
        n = len(emb) - OWW_EMBEDDINGS + 1
        x = np.stack([emb[i : i + OWW_EMBEDDINGS] for i in range(n)]).astype(np.float32)
        last_frame = np.array([starts[i + OWW_EMBEDDINGS - 1] + OWW_MEL_WINDOW for i in range(n)])
        ends = np.maximum(((last_frame - 1) * OWW_HOP_SAMPLES + OWW_FFT_SAMPLES - front) / rate, 0.0)
        return Windows(x, ends)

    def features(self, samples: np.ndarray) -> np.ndarray:
        """openWakeWord's mel features of float samples (-1..1): one row of 32 per frame (see :meth:`mel`)."""
        return self.mel((samples * 32767.0).astype(np.float32)) / 10.0 + 2.0

    def embed(self, features: np.ndarray, starts: Sequence[int]) -> np.ndarray:
        """The speech embedding (N, 96) of the OWW_MEL_WINDOW feature rows from each of ``starts``, run
        OWW_EMBEDDING_BATCH windows at a time."""
        return np.concatenate([
            self._embedding.run(np.stack([features[s : s + OWW_MEL_WINDOW] for s in starts[i : i + OWW_EMBEDDING_BATCH]])[..., None])
            for i in range(0, len(starts), OWW_EMBEDDING_BATCH)
        ]).reshape(len(starts), OWW_EMBEDDING_SIZE)

    def mel(self, pcm: np.ndarray) -> np.ndarray:
        """Mel frames (no hop padding: frame f covers samples f*hop .. f*hop+fft) of int16-scaled samples, computed
        OWW_MEL_CHUNK_FRAMES at a time so that memory stays bounded whatever the clip's length."""
        n = (len(pcm) - OWW_FFT_SAMPLES) // OWW_HOP_SAMPLES + 1
        parts = []
        for f0 in range(0, n, OWW_MEL_CHUNK_FRAMES):
            f1 = min(n, f0 + OWW_MEL_CHUNK_FRAMES)
            seg = pcm[f0 * OWW_HOP_SAMPLES : (f1 - 1) * OWW_HOP_SAMPLES + OWW_FFT_SAMPLES]
            parts.append(np.squeeze(self._mel.run(seg[None])).reshape(-1, 32)[: f1 - f0])
        return np.concatenate(parts)

    def close(self) -> None:
        self._mel.close()
        self._embedding.close()


class WaveformFrontEnd:
    """The model takes raw samples: windows of the model's input length, every half window."""

    def __init__(self, length: int) -> None:
        if length < 1:
            raise BadInput(f"a waveform model needs a fixed input length, not {length}")
        self.input_shape = (length,)

    def windows(self, samples: np.ndarray, rate: int) -> Windows:
        n = self.input_shape[0]
        if len(samples) < n:
            samples = np.concatenate([np.zeros(n - len(samples), np.float32), samples])
        starts = list(range(0, len(samples) - n + 1, max(1, n // 2)))
        if starts[-1] != len(samples) - n:
            starts.append(len(samples) - n)
        return Windows(np.stack([samples[s : s + n] for s in starts]).astype(np.float32), (np.array(starts) + n) / rate)

    def close(self) -> None:
        pass


def open_frontend(kind: FrontEnd, files: list[Path], input_shape: tuple[int, ...], placement: Any = None) -> Any:
    """``placement``: where a front end with models runs them (OpenWakeWordFrontEnd)."""
    if kind is FrontEnd.OPENWAKEWORD:
        if len(files) != 2:
            raise BadInput(f"the openwakeword front end takes two models (mel spectrogram, embedding), got {len(files)}")
        return OpenWakeWordFrontEnd(files[0], files[1], placement)
    return WaveformFrontEnd(int(np.prod(input_shape)))
