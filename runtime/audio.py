"""Audio in: WAV files -> samples at the model's rate -> the model's feature front end -> model inputs.

WAV files are read with the standard library (PCM 8/16/24/32-bit, any channel
count, mixed down to mono) and checked before anything else sees them: not a
RIFF/WAVE file, a compressed format, no samples, or longer than
:data:`MAX_SECONDS` is one clear error. A file at another sample rate is
resampled (band-limited, by FFT) and the result says so.

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
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime.errors import BadInput

MAX_SECONDS = 600
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


@dataclass(frozen=True)
class WavInfo:
    channels: int
    width: int  # bytes per sample
    rate: int
    frames: int

    @property
    def working_bytes(self) -> int:
        """Memory to read and prepare the file: its raw bytes, the mono float32 samples and two float copies."""
        return self.frames * (self.channels * self.width + 12)


def _open(path: Path) -> Any:
    try:
        with path.open("rb") as f:
            head = f.read(12)
    except OSError as exc:
        raise BadInput(f"{path}: cannot read the audio file ({exc.strerror or exc})") from None
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        raise BadInput(f"{path}: not a WAV file (expected a RIFF/WAVE header); give 8/16/24/32-bit PCM .wav files")
    try:
        return wave.open(str(path), "rb")
    except wave.Error as exc:
        raise BadInput(f"{path}: not a PCM WAV file this can read ({exc}); give 8/16/24/32-bit integer PCM") from None
    except EOFError:
        raise BadInput(f"{path}: the WAV file is truncated") from None


def wav_info(path: Path | str, w: Any = None) -> WavInfo:
    """The header, checked (RIFF/WAVE, PCM, rate, not empty, not longer than MAX_SECONDS), without reading samples."""
    path = Path(path)
    if w is None:
        with _open(path) as opened:
            return wav_info(path, opened)
    info = WavInfo(w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes())
    if not 1000 <= info.rate <= 384_000:
        raise BadInput(f"{path}: sample rate {info.rate} Hz is not valid (1000..384000)")
    if info.frames == 0:
        raise BadInput(f"{path}: the WAV file holds no samples")
    if info.frames > MAX_SECONDS * info.rate:
        raise BadInput(f"{path}: {info.frames / info.rate:.0f} s of audio is longer than the {MAX_SECONDS} s this reads at once")
    return info


def read_wav(path: Path | str) -> tuple[np.ndarray, int]:
    """Mono float32 samples in -1..1 and the file's sample rate."""
    path = Path(path)
    with _open(path) as w:
        info = wav_info(path, w)
        try:
            raw = w.readframes(info.frames)
        except (wave.Error, EOFError):
            raise BadInput(f"{path}: the WAV file is truncated") from None
    channels, width, rate = info.channels, info.width, info.rate
    n = len(raw) // (width * channels)
    if n == 0:
        raise BadInput(f"{path}: the WAV file is truncated (no whole sample frames)")
    raw = raw[: n * width * channels]
    if width == 1:
        x = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 2:
        x = np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0
    elif width == 3:
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        x = (((b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)) << 8) >> 8).astype(np.float32) / 8388608.0
    elif width == 4:
        x = np.frombuffer(raw, "<i4").astype(np.float32) / 2147483648.0
    else:
        raise BadInput(f"{path}: {width * 8}-bit samples are not supported (8, 16, 24 or 32-bit PCM)")
    return x.reshape(n, channels).mean(axis=1).astype(np.float32), rate


def resample(x: np.ndarray, src: int, dst: int) -> np.ndarray:
    """Band-limited resampling by FFT (the spectrum truncated or zero-padded), for clips."""
    if src == dst:
        return x
    n = max(1, round(len(x) * dst / src))
    spectrum = np.fft.rfft(x.astype(np.float64))
    keep = n // 2 + 1
    if keep <= len(spectrum):
        spectrum = spectrum[:keep]
    else:
        spectrum = np.concatenate([spectrum, np.zeros(keep - len(spectrum), spectrum.dtype)])
    return (np.fft.irfft(spectrum, n) * (n / len(x))).astype(np.float32)


def load_audio(path: Path | str, rate: int) -> Audio:
    x, file_rate = read_wav(path)
    if file_rate == rate:
        return Audio(x, rate)
    return Audio(np.clip(resample(x, file_rate, rate), -1.0, 1.0), rate, resampled_from=file_rate)


def wav_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in WAV_SUFFIXES)


def write_wav(path: Path, x: np.ndarray, rate: int) -> None:
    """16-bit mono PCM (tests, tools)."""
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(x, -1.0, 1.0) * 32767).astype("<i2").tobytes())


@dataclass(frozen=True)
class Windows:
    x: np.ndarray  # float32 model inputs, one row per position
    ends: np.ndarray  # seconds: where each window ends in the audio


class OpenWakeWordFrontEnd:
    """Mel spectrogram + speech embedding (float ONNX models, run by ONNX Runtime)."""

    input_shape = (OWW_EMBEDDINGS, OWW_EMBEDDING_SIZE)

    def __init__(self, mel: Path, embedding: Path, threads: int = 1) -> None:
        from runtime.backends.ort import ORTBackend

        self._mel = ORTBackend(mel, threads=threads)
        try:
            self._embedding = ORTBackend(embedding, threads=threads)
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
        mel = self.mel((samples * 32767.0).astype(np.float32)) / 10.0 + 2.0
        starts = range(0, len(mel) - OWW_MEL_WINDOW + 1, OWW_MEL_STEP)
        emb = np.concatenate([
            self._embedding.run(np.stack([mel[s : s + OWW_MEL_WINDOW] for s in starts[i : i + OWW_EMBEDDING_BATCH]])[..., None])
            for i in range(0, len(starts), OWW_EMBEDDING_BATCH)
        ]).reshape(len(starts), OWW_EMBEDDING_SIZE)
        n = len(emb) - OWW_EMBEDDINGS + 1
        x = np.stack([emb[i : i + OWW_EMBEDDINGS] for i in range(n)]).astype(np.float32)
        last_frame = np.array([starts[i + OWW_EMBEDDINGS - 1] + OWW_MEL_WINDOW for i in range(n)])
        ends = np.maximum(((last_frame - 1) * OWW_HOP_SAMPLES + OWW_FFT_SAMPLES - front) / rate, 0.0)
        return Windows(x, ends)

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


def open_frontend(kind: FrontEnd, files: list[Path], input_shape: tuple[int, ...], threads: int = 1) -> Any:
    if kind is FrontEnd.OPENWAKEWORD:
        if len(files) != 2:
            raise BadInput(f"the openwakeword front end takes two models (mel spectrogram, embedding), got {len(files)}")
        return OpenWakeWordFrontEnd(files[0], files[1], threads)
    return WaveformFrontEnd(int(np.prod(input_shape)))
