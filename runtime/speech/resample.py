"""Band-limited resampling in bounded memory.

The method is the ideal low-pass one: a signal's spectrum truncated (down) or
zero-padded (up) by FFT. Done over a whole clip, it holds the clip in float64
and its spectrum: 600 s at 384 kHz peaked at 8.2 GB. Here the input goes
through CHUNK_SECONDS at a time; each chunk is resampled together with
MARGIN_SECONDS of its neighbours on both sides (silence beyond the clip) and
only its middle is kept, so memory is one chunk's whatever the clip's length
(:func:`working_bytes`). Chunk edges fall where the input and output grids
meet (multiples of ``src / gcd(src, dst)`` input samples), so output sample
``j`` is the band-limited value at input time ``j * src / dst``. A stream is
resampled the same way as it arrives by :class:`Resampler`, one chunk's
worth held (the Wyoming server's transcribe requests).

Against the whole-clip FFT it replaces, on clips with silent ends and a whole
number of output samples (tests/runtime/test_audio.py): within 5e-5 max abs
(full scale 1; an int16 step is 3e-5) when the content stays below 80 % of the
lower Nyquist frequency, as speech does, and within 2e-3 for white noise up to
Nyquist, whose energy at the cut-off is where the ideal filter's sinc tails
(decaying as 1/t) reach past the margin. Elsewhere the whole-clip method
differed by its own artefacts: it wrapped the clip's end into its start, and
stretched the clip by up to half an output sample to round its length.
"""

from __future__ import annotations

from collections.abc import Iterable
from math import ceil, gcd

import numpy as np

CHUNK_SECONDS, MARGIN_SECONDS = 2.0, 0.5


def output_length(n_in: int, src: int, dst: int) -> int:
    return max(1, round(n_in * dst / src))


class _Geometry:
    def __init__(self, src: int, dst: int, chunk_seconds: float = CHUNK_SECONDS) -> None:
        g = gcd(src, dst)
        self.u_in, self.u_out = src // g, dst // g  # u_in input samples span exactly u_out output samples
        self.chunk = max(1, round(chunk_seconds * src / self.u_in)) * self.u_in
        self.margin = max(1, ceil(MARGIN_SECONDS * src / self.u_in)) * self.u_in

    def outputs(self, n: int) -> int:
        return n // self.u_in * self.u_out


def working_bytes(src: int, dst: int, chunk_seconds: float = CHUNK_SECONDS) -> int:
    """Peak memory of resampling, whatever the clip's length: the float32 window of one chunk with its margins (twice
    while a block is appended), its float64 copy, its spectrum and pocketfft's own work buffer (about one more), the
    resized spectrum, the float64 output and the float32 copy written out. Measured in tests/runtime/test_audio.py."""
    if src == dst:
        return 0
    geo = _Geometry(src, dst, chunk_seconds)
    n_in = geo.chunk + 2 * geo.margin
    n_out = geo.outputs(n_in)
    return n_in * (2 * 4 + 8 + 16 + 16) + n_out * (16 + 8 + 4)


def _resample_window(window: np.ndarray, geo: _Geometry, keep_from: int, keep: int) -> np.ndarray:
    n = geo.outputs(len(window))
    spectrum = np.fft.rfft(window.astype(np.float64))
    bins = n // 2 + 1
    if bins <= len(spectrum):
        spectrum = spectrum[:bins]
    else:
        spectrum = np.concatenate([spectrum, np.zeros(bins - len(spectrum), spectrum.dtype)])
    y = np.fft.irfft(spectrum, n)
    y *= n / len(window)
    return y[keep_from : keep_from + keep]


class Resampler:
    """Resampling of a stream as it arrives: :meth:`feed` takes float32 samples at ``src`` Hz (any block sizes) and
    returns the output samples they complete; :meth:`finish` returns the rest, so that the whole output is
    :func:`output_length` of the input's, sample for sample what :func:`resample` gives on the whole clip with the
    same ``chunk_seconds``. Held between calls: under one chunk with its two margins (float32 at ``src``), whatever
    the stream's length; a shorter chunk holds less and costs more FFT work per sample (the margins, which set the
    accuracy, are resampled with every chunk)."""

    def __init__(self, src: int, dst: int, chunk_seconds: float = CHUNK_SECONDS) -> None:
        self.src, self.dst = src, dst
        self._geo = _Geometry(src, dst, chunk_seconds)
        self._window = np.zeros(self._geo.margin, np.float32)  # silence before the clip; window[margin]: the next input
        self.n_in = 0  # input samples fed
        self.n_out = 0  # output samples returned

    @property
    def held_bytes(self) -> int:
        return self._window.nbytes

    def _emit(self, chunk: int) -> np.ndarray:
        geo = self._geo
        y = _resample_window(self._window[: chunk + 2 * geo.margin], geo, geo.outputs(geo.margin), geo.outputs(chunk))
        self._window = self._window[chunk:].copy()  # a view would keep the whole window alive
        return y.astype(np.float32)

    def feed(self, block: np.ndarray) -> np.ndarray:
        geo = self._geo
        self.n_in += len(block)
        self._window = np.concatenate([self._window, np.asarray(block, np.float32)])
        parts = []
        while len(self._window) >= geo.chunk + 2 * geo.margin:  # a whole chunk with its right margin: final values
            parts.append(self._emit(geo.chunk))
        y = np.concatenate(parts) if parts else np.zeros(0, np.float32)
        self.n_out += len(y)
        return y

    def finish(self) -> np.ndarray:
        """The rest of the output (the input's end followed by silence); the stream is over."""
        geo, total = self._geo, output_length(self.n_in, self.src, self.dst)
        parts = []
        while self.n_out < total:
            pending = max(len(self._window) - geo.margin, 1)
            chunk = min(geo.chunk, ceil(pending / geo.u_in) * geo.u_in)
            if len(self._window) < chunk + 2 * geo.margin:
                self._window = np.concatenate([self._window, np.zeros(chunk + 2 * geo.margin - len(self._window), np.float32)])
            y = self._emit(chunk)[: total - self.n_out]
            parts.append(y)
            self.n_out += len(y)
        self._window = np.zeros(0, np.float32)
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def resample_into(blocks: Iterable[np.ndarray], src: int, dst: int, out: np.ndarray) -> None:
    """Resample the float32 samples arriving in ``blocks`` (any sizes; ``src`` Hz) into ``out`` (``dst`` Hz, its
    length :func:`output_length` of the input's), holding one chunk at a time."""
    stream, done = Resampler(src, dst), 0

    def write(y: np.ndarray) -> None:
        nonlocal done
        take = min(len(y), len(out) - done)
        out[done : done + take] = y[:take]
        done += take

    for block in blocks:
        write(stream.feed(block))
    write(stream.finish())


def resample(x: np.ndarray, src: int, dst: int) -> np.ndarray:
    """``x`` (float, ``src`` Hz) at ``dst`` Hz, float32."""
    if src == dst:
        return x
    out = np.empty(output_length(len(x), src, dst), np.float32)
    step = _Geometry(src, dst).chunk
    resample_into((x[i : i + step].astype(np.float32) for i in range(0, len(x), step)), src, dst, out)
    return out
