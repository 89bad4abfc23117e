"""Audio in and out of the assistant: a WAV file or a microphone in, a WAV file or a speaker out.

Input comes out as :class:`~apps.voice.types.AudioChunk` frames of FRAME_SAMPLES at SAMPLE_RATE. A WAV file is read
by runtime.classify.audio_frontend (checked: one BadInput line for a file that is not PCM WAV), resampled from another rate with a
log line, refused below MIN_INPUT_RATE (too little of the speech band left to recognize); a clipped recording is
used as is with a warning. It is followed by TAIL_SILENCE_S of silence so the last utterance ends, and paced in real
time unless ``realtime`` is False. The microphone (PortAudio through sounddevice, imported only here) is opened at
SAMPLE_RATE; a device that cannot record at that rate, or that goes away, is one StageError line.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from apps.voice.types import FRAME_SAMPLES, SAMPLE_RATE, AudioChunk, Stage, StageError
from runtime.errors import BadInput, missing, one_line

log = logging.getLogger(__name__)

MIN_INPUT_RATE = 8000  # telephone band: the lowest rate speech is still recognizable from
TAIL_SILENCE_S = 1.5  # after a file's last sample: longer than the VAD's hangover
CLIPPED_FRACTION = 0.001  # samples at full scale beyond this share: the recording is clipped


def _clipped_share(x: np.ndarray) -> float:
    return float(np.count_nonzero(np.abs(x) >= 0.999)) / max(1, len(x))


class WavSource:
    """A WAV file as input frames."""

    def __init__(self, path: Path | str, *, realtime: bool = True, tail_silence_s: float = TAIL_SILENCE_S) -> None:
        from runtime.classify.audio_frontend import load_audio, wav_info

        self.path = Path(path)
        info = wav_info(self.path)  # BadInput naming the file for anything but PCM WAV
        if info.rate < MIN_INPUT_RATE:
            raise BadInput(f"{self.path}: {info.rate} Hz is too low a sample rate for speech; give a WAV file of at least "
                           f"{MIN_INPUT_RATE} Hz (16000 Hz is what the models take)")
        audio = load_audio(self.path, SAMPLE_RATE)
        if audio.resampled_from:
            log.warning("%s: resampled from %d Hz to %d Hz", self.path, audio.resampled_from, SAMPLE_RATE)
        share = _clipped_share(audio.samples)
        if share > CLIPPED_FRACTION:
            log.warning("%s: %.1f %% of the samples are at full scale (clipped); recognition may suffer", self.path, 100 * share)
        self.samples = np.concatenate([audio.samples, np.zeros(int(tail_silence_s * SAMPLE_RATE), np.float32)])
        self.realtime, self.resampled_from, self.clipped_share = realtime, audio.resampled_from, share
        self._stop = threading.Event()

    def frames(self) -> Iterator[AudioChunk]:
        start = time.monotonic()
        for i, at in enumerate(range(0, len(self.samples), FRAME_SAMPLES)):
            if self._stop.is_set():
                return
            frame = self.samples[at : at + FRAME_SAMPLES]
            if len(frame) < FRAME_SAMPLES:
                frame = np.pad(frame, (0, FRAME_SAMPLES - len(frame)))
            if self.realtime:  # this frame is "captured" once its last sample has been spoken
                due = start + (i + 1) * FRAME_SAMPLES / SAMPLE_RATE
                time.sleep(max(0.0, due - time.monotonic()))
            yield AudioChunk(frame, SAMPLE_RATE, time.monotonic())

    def close(self) -> None:
        self._stop.set()


class MicSource:
    """The default (or named) microphone, mono at SAMPLE_RATE. Frames wait in a bounded queue (MAX_QUEUED_S of
    audio); when the pipeline falls behind, the oldest are dropped and counted, never an unbounded backlog."""

    MAX_QUEUED_S = 4.0
    MAX_SILENT_S = 2.0  # no frame for this long: the device is gone
    POLL_S = 0.25

    def __init__(self, device: str | int | None = None) -> None:
        try:
            import sounddevice as sd
        except ImportError as exc:
            raise missing("sounddevice", "voice") from exc
        except OSError as exc:  # the PortAudio library itself is missing
            raise StageError(Stage.INPUT, f"PortAudio is not available ({one_line(exc)}); use --input FILE.wav",
                             fatal=True) from exc
        self._sd = sd
        self._queue: queue.Queue[np.ndarray] = queue.Queue(maxsize=int(self.MAX_QUEUED_S * SAMPLE_RATE / FRAME_SAMPLES))
        self.dropped = 0
        self._status: str | None = None
        try:
            self._stream = sd.InputStream(samplerate=SAMPLE_RATE, channels=1, dtype="float32", blocksize=FRAME_SAMPLES,
                                          device=device, callback=self._callback)
            self._stream.start()
        except Exception as exc:
            raise StageError(Stage.INPUT, f"cannot record from microphone {device or '(default)'} at {SAMPLE_RATE} Hz mono: "
                             f"{one_line(exc)}", fatal=True) from exc

    def _callback(self, data: np.ndarray, frames: int, _time: Any, status: Any) -> None:
        if status:
            self._status = str(status)
        try:
            self._queue.put_nowait(data[:, 0].copy())
        except queue.Full:
            self.dropped += 1
            try:
                self._queue.get_nowait()
                self._queue.put_nowait(data[:, 0].copy())
            except (queue.Empty, queue.Full):
                pass

    def frames(self) -> Iterator[AudioChunk]:
        """Frames as recorded. A live input delivers one every 32 ms: when none came for MAX_SILENT_S, or PortAudio
        says the stream stopped, the device is gone (unplugged), a fatal StageError; a device that vanishes with
        its stream still "active" (ALSA may simply stop calling back) is not waited on for ever."""
        waited = 0.0
        while True:
            try:
                frame = self._queue.get(timeout=self.POLL_S)
            except queue.Empty:
                waited += self.POLL_S
                if not self._active() or waited >= self.MAX_SILENT_S:
                    why = f"no audio for {waited:.1f} s" if waited >= self.MAX_SILENT_S else "the stream stopped"
                    status = f"; PortAudio: {self._status}" if self._status else ""
                    raise StageError(Stage.INPUT, f"the microphone stopped delivering audio ({why}{status}; "
                                     "disconnected?)", fatal=True) from None
                continue
            waited = 0.0
            yield AudioChunk(frame, SAMPLE_RATE, time.monotonic())

    def _active(self) -> bool:
        try:
            return bool(self._stream.active)
        except Exception:  # PortAudio's own error on a stream whose device has gone
            return False

    def close(self) -> None:
        try:
            self._stream.stop()
            self._stream.close()
        except Exception as exc:  # closing a vanished device
            log.warning("microphone close: %s", one_line(exc))


class WavSink:
    """Answers into one WAV file (16-bit mono), written as they come into ``PATH.part``, renamed onto PATH when
    closed (never a half-written file at PATH; a session with no answer leaves an empty WAV). ``realtime`` paces
    writes as a speaker would play them (so that barge-in on file input behaves as it would live). The rate is the
    first chunk's; a later chunk at another rate is resampled."""

    EMPTY_RATE = 22_050

    def __init__(self, path: Path | str, *, realtime: bool = False) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise BadInput(f"--output {self.path} is a directory; give a .wav file path or 'speaker'")
        if not self.path.parent.is_dir():
            raise BadInput(f"--output {self.path}: folder {self.path.parent} does not exist")
        self.realtime = realtime
        self._part = self.path.with_name(self.path.name + ".part")
        self._closed = False
        self.rate: int | None = None
        self.seconds = 0.0
        self._w: Any = None
        self._stop = threading.Event()

    def write(self, chunk: AudioChunk) -> None:
        from runtime.speech.resample import resample

        if self._w is None:
            self.rate = chunk.rate
            self._w = wave.open(str(self._part), "wb")
            self._w.setnchannels(1)
            self._w.setsampwidth(2)
            self._w.setframerate(chunk.rate)
        if chunk.rate != self.rate:
            assert self.rate is not None
            chunk = AudioChunk(resample(chunk.samples, chunk.rate, self.rate), self.rate, chunk.t)
        self._w.writeframes(chunk.pcm16())
        self.seconds += chunk.seconds
        if self.realtime:
            self._stop.wait(chunk.seconds)
            self._stop.clear()

    def stop(self) -> None:
        """Barge-in: a paced write returns at once."""
        self._stop.set()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._w is None:  # nothing was said: an empty file, so a caller can tell "no answer" from "no file"
            self._w = wave.open(str(self._part), "wb")
            self._w.setnchannels(1)
            self._w.setsampwidth(2)
            self._w.setframerate(self.EMPTY_RATE)
        self._w.close()
        os.replace(self._part, self.path)


class SpeakerSink:
    """The default (or named) speaker through PortAudio; opened at the first chunk's rate. ``stop`` (barge-in)
    aborts what is buffered."""

    def __init__(self, device: str | int | None = None) -> None:
        try:
            import sounddevice as sd
        except ImportError as exc:
            raise missing("sounddevice", "voice") from exc
        except OSError as exc:
            raise StageError(Stage.OUTPUT, f"PortAudio is not available ({one_line(exc)}); use --output FILE.wav",
                             fatal=True) from exc
        self._sd, self.device = sd, device
        self._stream: Any = None
        self.rate: int | None = None

    def write(self, chunk: AudioChunk) -> None:
        if self._stream is None or self.rate != chunk.rate:
            self.close()
            try:
                self._stream = self._sd.OutputStream(samplerate=chunk.rate, channels=1, dtype="float32", device=self.device)
                self._stream.start()
            except Exception as exc:
                raise StageError(Stage.OUTPUT, f"cannot play on speaker {self.device or '(default)'} at {chunk.rate} Hz: "
                                 f"{one_line(exc)}") from exc
            self.rate = chunk.rate
        for at in range(0, len(chunk.samples), 2048):  # small writes: a stop takes effect within ~0.1 s
            if not self._stream.active:
                return
            self._stream.write(np.ascontiguousarray(chunk.samples[at : at + 2048], np.float32)[:, None])

    def stop(self) -> None:
        if self._stream is not None:
            try:
                self._stream.abort()
                self._stream.start()
            except Exception as exc:
                log.warning("speaker stop: %s", one_line(exc))

    def close(self) -> None:
        if self._stream is not None:
            try:
                self._stream.stop()
                self._stream.close()
            finally:
                self._stream = None
