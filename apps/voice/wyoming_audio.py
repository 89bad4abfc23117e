"""One transcribe request's audio as a Wyoming connection receives it, and the worker threads the server's model
calls and audio conversion run in.

:class:`SpeechBuffer` converts each chunk, as it arrives, to what the speech-to-text model hears: 16-bit mono at
:data:`apps.voice.types.SAMPLE_RATE`. Width and channels go through the ``wyoming`` package's converter; another
rate through :class:`runtime.speech.resample.Resampler`, the band-limited resampler of every other edgerun input, chunk by
chunk. What a connection holds is then its audio at 16 kHz (32 KB a second: 1.9 MB for 60 s) and the resampler's
window (1.5 s at the input's rate: 2.3 MB at 384 kHz), where it used to hold the input's rate until audio-stop (46 MB
for 60 s at 384 kHz) and resample the whole request there, on the event loop.

:class:`Workers`: one thread per served model, so a slow transcription queues behind other transcriptions only, never
in front of another satellite's wake-word detection (a pool shared by every model filled with waiting transcriptions
and starved the rest); one more for resampling, so its FFT work stays off the event loop. Each connection has at most
one call in flight (its events are handled one at a time), so a worker's queue is bounded by the server's connection
limit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
from wyoming.audio import AudioChunk, AudioChunkConverter

from apps.voice.types import SAMPLE_RATE
from runtime.speech.resample import Resampler

T = TypeVar("T")
# The resampler's chunk for a stream: its window (chunk and two 0.5 s margins) is what a connection holds between
# chunks, and one window's FFT the working memory of a conversion (runtime.speech.resample.working_bytes: 28 MB at 384 kHz
# with 0.5 s, 57 MB with the 2 s of whole files); the margins, which set the accuracy, are the same.
STREAM_CHUNK_SECONDS = 0.5


def _pcm16(x: np.ndarray) -> bytes:
    return (np.clip(x, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


class SpeechBuffer:
    """One audio stream of a transcribe request: chunks of ``rate`` Hz, ``width`` bytes, ``channels`` (checked by the
    caller) in, float32 mono at SAMPLE_RATE out. :meth:`add` and :meth:`samples` of one buffer are called one at a
    time; when :attr:`resamples`, they do FFT work (run them in a worker thread), otherwise they only copy bytes."""

    def __init__(self, rate: int, width: int, channels: int) -> None:
        self.rate, self.width, self.channels = rate, width, channels
        self._converter = AudioChunkConverter(width=2, channels=1)
        self._resampler = Resampler(rate, SAMPLE_RATE, STREAM_CHUNK_SECONDS) if rate != SAMPLE_RATE else None
        self._pcm = bytearray()  # 16-bit mono at SAMPLE_RATE
        self.frames = 0  # input frames received

    @property
    def resamples(self) -> bool:
        return self._resampler is not None

    @property
    def seconds(self) -> float:
        """Audio received, in seconds."""
        return self.frames / self.rate

    @property
    def held_bytes(self) -> int:
        """Memory the buffer holds between chunks: the converted audio and the resampler's window."""
        return len(self._pcm) + (self._resampler.held_bytes if self._resampler is not None else 0)

    def add(self, audio: bytes) -> None:
        """One chunk's bytes (whole frames of the stream's format)."""
        pcm = self._converter.convert(AudioChunk(self.rate, self.width, self.channels, audio)).audio
        self.frames += len(pcm) // 2
        if self._resampler is None:
            self._pcm += pcm
        else:
            self._pcm += _pcm16(self._resampler.feed(np.frombuffer(pcm, "<i2").astype(np.float32) / 32768.0))

    def samples(self) -> np.ndarray:
        """The whole stream, float32 mono at SAMPLE_RATE (the resampler's tail included); the buffer is then empty."""
        if self._resampler is not None:
            self._pcm += _pcm16(self._resampler.finish())
            self._resampler = None
        x = np.frombuffer(bytes(self._pcm), "<i2").astype(np.float32) / 32768.0
        self._pcm = bytearray()
        return x


class Workers:
    """Named single-thread executors (``asr``, ``tts``, ``wake``, ``audio``): calls to one run in order, one at a
    time, and never wait for another's."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self._pools = {name: ThreadPoolExecutor(1, thread_name_prefix=f"wyoming-{name}") for name in names}

    def submit(self, name: str, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """``fn(*args)`` queued for worker ``name``'s thread: a future of the running loop to await."""
        return asyncio.get_running_loop().run_in_executor(self._pools[name], fn, *args)

    def close(self) -> None:
        """Wait for the calls under way, drop those queued, end the threads."""
        for pool in self._pools.values():
            pool.shutdown(wait=True, cancel_futures=True)
