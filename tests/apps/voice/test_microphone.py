"""apps.voice.audio_io.MicSource when the microphone disappears. There is no microphone on a build machine: a
stand-in ``sounddevice`` module records from a thread that calls the stream's callback every 32 ms, as PortAudio
does, until the "device" is unplugged."""

from __future__ import annotations

import sys
import threading
import time
import types
from typing import Any

import numpy as np
import pytest

from apps.voice.audio_io import MicSource
from apps.voice.types import FRAME_SAMPLES, SAMPLE_RATE, Stage, StageError


class _Stream:
    def __init__(self, *, samplerate: int, channels: int, dtype: str, blocksize: int, device: Any, callback: Any,
                 frames: int, unplug: str) -> None:
        assert (samplerate, channels, dtype, blocksize) == (SAMPLE_RATE, 1, "float32", FRAME_SAMPLES)
        self._callback, self._frames, self._unplug = callback, frames, unplug
        self.active = False
        self._closed = threading.Event()

    def start(self) -> None:
        self.active = True
        threading.Thread(target=self._record, daemon=True).start()

    def _record(self) -> None:
        for i in range(self._frames):
            if self._closed.wait(FRAME_SAMPLES / SAMPLE_RATE):
                return
            self._callback(np.full((FRAME_SAMPLES, 1), i / 100, np.float32), FRAME_SAMPLES, None, None)
        if self._unplug == "inactive":  # PortAudio noticed: the stream is no longer active
            self.active = False
        # "silent": the callbacks just stop and the stream still says it is active (ALSA on a vanished USB device)

    def stop(self) -> None:
        self._closed.set()

    def close(self) -> None:
        self._closed.set()


def _fake_sounddevice(monkeypatch: pytest.MonkeyPatch, frames: int, unplug: str) -> None:
    sd = types.ModuleType("sounddevice")
    sd.InputStream = lambda **kw: _Stream(**kw, frames=frames, unplug=unplug)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sounddevice", sd)


@pytest.mark.parametrize("unplug", ["silent", "inactive"])
def test_a_microphone_that_disappears_ends_the_input_in_one_line_not_a_hang(monkeypatch: pytest.MonkeyPatch,
                                                                             unplug: str) -> None:
    _fake_sounddevice(monkeypatch, frames=10, unplug=unplug)
    mic = MicSource()
    got: list[Any] = []

    def read() -> None:
        try:
            for chunk in mic.frames():
                got.append(chunk)
        except StageError as exc:
            got.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    t0 = time.monotonic()
    reader.start()
    reader.join(timeout=MicSource.MAX_SILENT_S + 5.0)
    mic.close()
    assert not reader.is_alive(), "the input waited for ever on a microphone that was gone"
    *frames, error = got
    assert len(frames) == 10 and [float(f.samples[0]) for f in frames] == pytest.approx([i / 100 for i in range(10)])
    assert isinstance(error, StageError) and error.fatal and error.stage is Stage.INPUT
    assert "microphone stopped delivering audio" in str(error) and "\n" not in str(error)
    assert time.monotonic() - t0 < MicSource.MAX_SILENT_S + 2.0
