"""runtime.audio: WAV files are checked before use, read at every PCM width, mixed down, and resampled faithfully."""

from __future__ import annotations

import struct
import wave
from pathlib import Path

import numpy as np
import pytest

from runtime.audio import WaveformFrontEnd, load_audio, read_wav, resample, write_wav
from runtime.bundle import AudioSpec
from runtime.errors import BadInput

RATE = 16000


def tone(freq: float, seconds: float, rate: int, amp: float = 0.5) -> np.ndarray:
    return (amp * np.sin(2 * np.pi * freq * np.arange(int(seconds * rate)) / rate)).astype(np.float32)


def write_pcm(path: Path, x: np.ndarray, rate: int, width: int, channels: int = 1) -> None:
    frames = np.repeat(x[:, None], channels, axis=1).ravel()
    if width == 1:
        raw = np.clip(np.round(frames * 127 + 128), 0, 255).astype(np.uint8).tobytes()
    elif width == 3:
        ints = np.round(frames * 8388607).astype(np.int32)
        raw = b"".join(struct.pack("<i", int(v))[:3] for v in ints)
    else:
        dtype, scale = {2: ("<i2", 32767), 4: ("<i4", 2147483647)}[width]
        raw = np.round(frames * scale).astype(dtype).tobytes()
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(raw)


@pytest.mark.parametrize("width, tol", [(1, 1 / 100), (2, 1e-4), (3, 1e-6), (4, 1e-6)])
@pytest.mark.parametrize("channels", [1, 2])
def test_every_pcm_width_reads_back(tmp_path: Path, width: int, tol: float, channels: int) -> None:
    x = tone(440, 0.1, RATE)
    path = tmp_path / "t.wav"
    write_pcm(path, x, RATE, width, channels)
    y, rate = read_wav(path)
    assert rate == RATE and y.dtype == np.float32 and y.shape == x.shape
    assert np.abs(y - x).max() < tol


def test_resampling_keeps_pitch_and_level() -> None:
    x = tone(1000, 1.0, 44100)
    y = resample(x, 44100, RATE)
    assert len(y) == RATE
    spectrum = np.abs(np.fft.rfft(y))
    assert abs(int(spectrum.argmax()) - 1000) <= 1  # 1 Hz bins over one second
    assert abs(np.sqrt((y[100:-100] ** 2).mean()) - 0.5 / np.sqrt(2)) < 0.01


def test_a_file_at_another_rate_is_resampled_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "cd.wav"
    write_wav(path, tone(300, 0.5, 44100), 44100)
    clip = load_audio(path, RATE)
    assert clip.rate == RATE and clip.resampled_from == 44100 and len(clip.samples) == RATE // 2
    assert load_audio(path, 44100).resampled_from is None


def _float_wav(path: Path) -> None:
    """A WAVE_FORMAT_IEEE_FLOAT file, which the standard library (and so edgerun) does not read."""
    data = np.zeros(100, "<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, RATE, RATE * 4, 4, 32)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)


@pytest.mark.parametrize("name, make, message", [
    ("not a wav", lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100)), "not a WAV file"),
    ("empty file", lambda p: p.write_bytes(b""), "not a WAV file"),
    ("float format", _float_wav, "not a PCM WAV file"),
    ("no samples", lambda p: write_pcm(p, np.zeros(0, np.float32), RATE, 2), "holds no samples"),
    ("truncated header", lambda p: p.write_bytes(b"RIFF\x10\x00\x00\x00WAVEfmt "), "PCM WAV"),
])
def test_bad_audio_files_are_one_clear_error(tmp_path: Path, name: str, make, message: str) -> None:
    path = tmp_path / "bad.wav"
    make(path)
    with pytest.raises(BadInput, match=message) as err:
        read_wav(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_truncated_data_reads_the_whole_frames_present(tmp_path: Path) -> None:
    path = tmp_path / "cut.wav"
    write_wav(path, tone(440, 0.5, RATE), RATE)
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2 + 1])  # the header still claims every frame; half are there, one odd byte
    y, _ = read_wav(path)
    assert 0 < len(y) < RATE // 2


def test_waveform_windows_cover_the_clip() -> None:
    fe = WaveformFrontEnd(1000)
    w = fe.windows(np.arange(2300, dtype=np.float32), RATE)
    assert w.x.shape == (4, 1000) and w.x[-1, -1] == 2299  # 0, 500, 1000, and the tail window ending at the last sample
    short = fe.windows(np.ones(10, np.float32), RATE)
    assert short.x.shape == (1, 1000) and short.x[0, :990].sum() == 0  # padded with silence in front


@pytest.mark.parametrize("field, value, message", [
    ("sample_rate", 12, "sample_rate 12"),
    ("frontend", "mfcc", "audio frontend 'mfcc' is not valid"),
    ("input_shape", [16, 0], "input_shape"),
    ("frontend_files", ["../etc/passwd"], "not a flat bundle file name"),
    ("threshold", 1.5, "threshold"),
])
def test_audio_manifest_section_is_validated(field: str, value: object, message: str) -> None:
    data = {"sample_rate": RATE, "frontend": "openwakeword", "input_shape": [16, 96], "frontend_files": ["a.onnx", "b.onnx"]}
    assert AudioSpec.from_dict(data).input_shape == (16, 96)
    with pytest.raises(BadInput, match=message):
        AudioSpec.from_dict({**data, field: value})
