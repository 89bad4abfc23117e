"""runtime.classify.audio_frontend: WAV files are checked before use, read at every PCM width, mixed down, and resampled faithfully,
in bounded memory."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import threading
import wave
from pathlib import Path

import numpy as np
import pytest

from runtime.bundle.manifest import AudioSpec
from runtime.classify.audio_frontend import WaveformFrontEnd, load_audio, read_wav, reading_bytes, resample, wav_info, write_wav
from runtime.errors import BadInput
from runtime.speech.resample import resample_into

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


def _chunk(cid: bytes, data: bytes, size: int | None = None, pad: bool = True) -> bytes:
    size = len(data) if size is None else size
    return cid + struct.pack("<I", size) + data + (b"\0" if pad and len(data) % 2 else b"")


def _riff(*chunks: bytes) -> bytes:
    body = b"WAVE" + b"".join(chunks)
    return b"RIFF" + struct.pack("<I", len(body)) + body


FMT = _chunk(b"fmt ", struct.pack("<HHIIHH", 1, 1, RATE, RATE * 2, 2, 16))
SAMPLES = np.arange(1000, dtype="<i2").tobytes()
DATA = _chunk(b"data", SAMPLES)
# WAVE_FORMAT_EXTENSIBLE with the PCM sub-format GUID (00000001-0000-0010-8000-00aa00389b71)
EXTENSIBLE = _chunk(b"fmt ", struct.pack("<HHIIHHHHI", 0xFFFE, 1, RATE, RATE * 2, 2, 16, 22, 16, 4)
                    + bytes.fromhex("0100000000001000800000aa00389b71"))

# Chunk layouts, each standing for a class of file: (id, bytes, frames read back).
READABLE = [
    # RIFF pads an odd-sized chunk to an even offset; a writer that leaves the pad out must not lose the samples.
    ("odd chunk, padded", _riff(FMT, _chunk(b"LIST", b"abc"), DATA), 1000),
    ("odd chunk, pad left out", _riff(FMT, _chunk(b"LIST", b"abc", pad=False), DATA), 1000),
    # A streaming writer's placeholder size: read what is there.
    ("data size 0xFFFFFFFF", _riff(FMT, _chunk(b"data", SAMPLES, size=2**32 - 1)), 1000),
    # An odd-sized data chunk of 16-bit samples: the whole frames.
    ("odd data size", _riff(FMT, _chunk(b"data", SAMPLES + b"\x01")), 1000),
    ("WAVE_FORMAT_EXTENSIBLE PCM", _riff(EXTENSIBLE, DATA), 1000),
]
REFUSED = [
    # The bare RuntimeError of the standard library's wave module: a chunk claiming more than the file holds.
    ("odd chunk size past the end", _riff(FMT, _chunk(b"LIST", b"abc", size=2**32 - 1), DATA), "chunk b'LIST' claims 4294967295 bytes"),
    ("fmt size past the end", _riff(_chunk(b"fmt ", FMT[8:], size=100_001), DATA), "chunk b'fmt ' claims 100001 bytes"),
    ("fmt too short", _riff(_chunk(b"fmt ", FMT[8:16]), DATA), "'fmt ' chunk of 8 bytes"),
    ("no data chunk", _riff(FMT), "no 'data' chunk"),
    ("data before fmt", _riff(DATA, FMT), "before their 'fmt ' chunk"),
    ("zero channels", _riff(_chunk(b"fmt ", struct.pack("<HHIIHH", 1, 0, RATE, 0, 0, 16)), DATA), "0 channels"),
    ("12-byte samples", _riff(_chunk(b"fmt ", struct.pack("<HHIIHH", 1, 1, RATE, RATE * 12, 12, 96)), DATA), "96-bit samples"),
    ("rate 0", _riff(_chunk(b"fmt ", struct.pack("<HHIIHH", 1, 1, 0, 0, 2, 16)), DATA), "sample rate 0 Hz"),
    ("mu-law", _riff(_chunk(b"fmt ", struct.pack("<HHIIHH", 7, 1, RATE, RATE, 1, 8)), DATA), "(mu-law)"),
    ("thousands of empty chunks", _riff(FMT, *[_chunk(b"junk", b"")] * 2000, DATA), "more than 1024 chunks"),
    ("less than one frame", _riff(FMT, _chunk(b"data", b"\x01")), "truncated (no whole sample frames)"),
]


@pytest.mark.parametrize("raw, frames", [c[1:] for c in READABLE], ids=[c[0] for c in READABLE])
def test_chunk_layouts_that_are_valid_read_back(tmp_path: Path, raw: bytes, frames: int) -> None:
    path = tmp_path / "ok.wav"
    path.write_bytes(raw)
    x, rate = read_wav(path)
    assert rate == RATE and len(x) == frames
    assert np.array_equal(x, np.arange(frames, dtype=np.float32) / 32768.0)


@pytest.mark.parametrize("raw, message", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_damaged_chunks_are_one_clear_error(tmp_path: Path, raw: bytes, message: str) -> None:
    path = tmp_path / "bad.wav"
    path.write_bytes(raw)
    for read in (read_wav, wav_info, lambda p: load_audio(p, 8000)):
        with pytest.raises(BadInput) as err:
            read(path)
        assert message in str(err.value) and str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value)


def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe.wav"
    os.mkfifo(path)
    return path


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
@pytest.mark.parametrize("make, kind", [(_fifo, "a FIFO"), (lambda t: t, "a directory"),
                                        (lambda t: Path(os.devnull), "a character device")], ids=["fifo", "dir", "device"])
def test_non_regular_files_are_refused_without_blocking(tmp_path: Path, make, kind: str) -> None:
    path = make(tmp_path)

    def unblock() -> None:  # if a read blocked on the FIFO, give it a writer that closes at once: EOF, not a hang
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass

    guard = threading.Timer(5.0, unblock)
    guard.start()
    try:
        for read in (read_wav, wav_info, lambda p: load_audio(p, RATE)):
            with pytest.raises(BadInput, match=f"is {kind}, not a WAV file"):
                read(path)
    finally:
        guard.cancel()


def _whole_clip_fft(x: np.ndarray, src: int, dst: int) -> np.ndarray:
    """The reference: the previous implementation, one FFT over the whole clip (an ideal low-pass)."""
    n = max(1, round(len(x) * dst / src))
    spectrum = np.fft.rfft(x.astype(np.float64))
    keep = n // 2 + 1
    spectrum = spectrum[:keep] if keep <= len(spectrum) else np.concatenate([spectrum, np.zeros(keep - len(spectrum), complex)])
    return (np.fft.irfft(spectrum, n) * (n / len(x))).astype(np.float32)


def _test_clip(src: int, dst: int, seconds: float, band: float) -> np.ndarray:
    """Two tones and noise below ``band`` x the lower Nyquist frequency, faded in and out over 0.3 s (silent ends)."""
    rng = np.random.default_rng(1)
    n = int(seconds * src)
    t = np.arange(n) / src
    noise = np.fft.rfft(rng.standard_normal(n))
    noise[np.fft.rfftfreq(n, 1 / src) > band * min(src, dst) / 2] = 0
    x = 0.3 * np.sin(2 * np.pi * 300 * t) + 0.2 * np.sin(2 * np.pi * 2500 * t) + 0.1 * np.fft.irfft(noise, n)
    return (x * np.clip(np.minimum(t, t[-1] - t) / 0.3, 0, 1)).astype(np.float32)


# (src, dst, seconds, noise band, max abs difference): the tolerances stated in runtime/speech/resample.py
EQUIVALENCE = [
    (44100, RATE, 7.0, 0.8, 5e-5), (384000, RATE, 6.0, 0.8, 5e-5), (8000, RATE, 5.0, 0.8, 5e-5), (RATE, 44100, 3.0, 0.8, 5e-5),
    (44100, RATE, 7.0, 1.0, 2e-3), (8000, RATE, 5.0, 1.0, 2e-3),
]


@pytest.mark.parametrize("src, dst, seconds, band, tol", EQUIVALENCE)
def test_chunked_resampling_matches_the_whole_clip_fft(src: int, dst: int, seconds: float, band: float, tol: float) -> None:
    x = _test_clip(src, dst, seconds, band)
    reference, y = _whole_clip_fft(x, src, dst), resample(x, src, dst)
    assert len(y) == len(reference) and y.dtype == np.float32
    assert np.abs(y - reference).max() < tol
    # the input's block sizes do not matter: chunk edges are fixed by the rates, not by how the samples arrive
    out = np.empty_like(y)
    resample_into((x[i : i + 999] for i in range(0, len(x), 999)), src, dst, out)
    assert np.array_equal(out, y)


def _sparse_wav(path: Path, seconds: float, rate: int) -> None:
    """A long 16-bit mono WAV without writing its bytes: a header, one second of tone, then a hole (silence)."""
    nbytes = int(seconds * rate) * 2
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    head = b"RIFF" + struct.pack("<I", 36 + nbytes) + b"WAVE" + _chunk(b"fmt ", fmt) + b"data" + struct.pack("<I", nbytes)
    with open(path, "wb") as f:
        f.write(head + (tone(440, 1.0, rate) * 32767).astype("<i2").tobytes())
        f.truncate(len(head) + nbytes)


_PEAK = """
import json, resource, sys
from runtime.classify.audio_frontend import load_audio
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
clip = load_audio(sys.argv[1], int(sys.argv[2]))
print(json.dumps({"growth": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024, "n": len(clip.samples)}))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss is in KiB on Linux")
def test_reading_a_long_high_rate_wav_stays_within_its_plan(tmp_path: Path) -> None:
    """A WAV at 384 kHz read for a 16 kHz model: the whole-clip FFT peaked at ~14 bytes per input frame (8.2 GB for
    600 s). Now the peak (measured in a fresh process) is within the plan, and grows with the clip at the model's rate
    only: 60 s and 20 s differ by their 16 kHz clips, not by their 384 kHz files."""
    growth = {}
    for seconds in (20, 60):
        path = tmp_path / f"long{seconds}.wav"
        _sparse_wav(path, seconds, 384_000)
        planned = reading_bytes([wav_info(path)], RATE)
        run = subprocess.run([sys.executable, "-c", _PEAK, str(path), str(RATE)], capture_output=True, text=True,
                             timeout=120, cwd=Path(__file__).resolve().parents[2], check=True)
        result = json.loads(run.stdout)
        assert result["n"] == seconds * RATE
        assert result["growth"] <= planned, f"{seconds} s: peak grew {result['growth'] >> 20} MiB, planned {planned >> 20} MiB"
        growth[seconds] = result["growth"]
    assert planned < 100 << 20  # the 60 s file is 44 MiB of int16, 88 MiB of float32 at 384 kHz
    assert growth[60] - growth[20] < 40 * RATE * 4 + (8 << 20)
    # The plan of the 600 s file: the 16 kHz clip (37 MiB) and a fixed working set, not gigabytes.
    path = tmp_path / "600.wav"
    _sparse_wav(path, 600, 384_000)
    assert reading_bytes([wav_info(path)], RATE) < 128 << 20
