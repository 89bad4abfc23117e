"""``edgerun wyoming``: Home Assistant's Wyoming protocol, spoken to with the ``wyoming`` package's own client.

The service runs on the real models (Whisper tiny.en, the Piper joe voice, openWakeWord's "alexa" head converted
to an INT8 bundle) under one residency manager, in a server thread; each test is one client conversation:
describe -> info, speech in -> transcript, text in -> speech that an independent Whisper hears back, a wake-word
stream -> detection (and a stream without it -> not-detected), and bad input answered with one error event while
the connection, and the server, go on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.server import AsyncTcpServer
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop
from wyoming.wake import Detect, Detection

from apps.cli import main as edgerun
from apps.voice.wyoming_server import MAX_EVENT_BYTES, check_uri
from runtime.errors import BadInput
from runtime.speech.resample import resample
from tests.converters.audio.speech import OTHER, WAKE, synthesize

ROOT = Path(__file__).resolve().parents[3]


def _words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]", " ", text.lower()).split()


def _pcm16(x: np.ndarray) -> bytes:
    return (np.clip(x, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


def _read_wav(path: Path) -> tuple[np.ndarray, int]:
    from runtime.classify.audio_frontend import read_wav

    return read_wav(path)


def _stream(x: np.ndarray, rate: int, samples: int = 1024) -> list[Event]:
    """audio-start, 16-bit mono chunks of ``samples`` (Home Assistant sends 1024), audio-stop."""
    pcm = _pcm16(x)
    events = [AudioStart(rate=rate, width=2, channels=1).event()]
    events += [AudioChunk(rate=rate, width=2, channels=1, audio=pcm[i : i + 2 * samples]).event()
               for i in range(0, len(pcm), 2 * samples)]
    return events + [AudioStop().event()]


async def _talk(port: int, events: list[Event], until: tuple[str, ...], timeout: float = 120.0) -> list[Event]:
    """Send ``events``, then read until an event of a type in ``until`` (or an error), returning everything read."""
    async with AsyncTcpClient("127.0.0.1", port, read_timeout=timeout) as client:
        for event in events:
            await client.write_event(event)
        got: list[Event] = []
        while True:
            event = await client.read_event()
            assert event is not None, f"the server closed the connection after {[e.type for e in got]}"
            got.append(event)
            if event.type in until or Error.is_type(event.type):
                return got


def talk(port: int, events: list[Event], *until: str) -> list[Event]:
    return asyncio.run(_talk(port, events, until))


class LiveWyoming:
    """The service on the wyoming package's AsyncTcpServer, on a free loopback port, in a thread of its own."""

    def __init__(self, service: object) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = AsyncTcpServer("127.0.0.1", 0)
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self.server.start(service.handler))  # type: ignore[attr-defined]
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, name="wyoming-server", daemon=True)
        self.thread.start()
        assert ready.wait(30)
        self.port = self.server._server.sockets[0].getsockname()[1]  # port 0: the one the OS picked

    def stop(self) -> None:
        async def stop() -> None:
            await self.server.stop()
            handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            await asyncio.wait_for(asyncio.gather(*handlers, return_exceptions=True), 30)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


# -- binding: no models needed ----------------------------------------------------------------------------------

@pytest.mark.parametrize("uri", ["tcp://127.0.0.1:10300", "tcp://localhost:10300", "tcp://[::1]:10300", "tcp://127.0.0.2:1",
                                 "unix:///tmp/edgerun-wyoming.sock", "stdio://"])
def test_loopback_and_local_uris_need_no_flag(uri: str) -> None:
    warned: list[str] = []
    assert check_uri(uri, warn=warned.append) == uri and not warned


@pytest.mark.parametrize("uri", ["tcp://0.0.0.0:10300", "tcp://192.168.1.20:10300", "tcp://[::]:10300", "tcp://homeassistant.local:10300"])
def test_a_lan_bind_needs_the_flag_and_warns(uri: str) -> None:
    with pytest.raises(BadInput, match="no authentication.*--allow-lan"):
        check_uri(uri)
    warned: list[str] = []
    assert check_uri(uri, allow_lan=True, warn=warned.append) == uri
    assert len(warned) == 1 and "no authentication" in warned[0]


@pytest.mark.parametrize("uri, message", [("tcp://127.0.0.1", "not tcp://HOST:PORT"), ("tcp://127.0.0.1:99999", "out of range"),
                                          ("http://127.0.0.1:10300", "not tcp://HOST:PORT"), ("unix://", "no socket path")])
def test_bad_uris_are_one_line(uri: str, message: str) -> None:
    with pytest.raises(BadInput, match=message):
        check_uri(uri)


def test_cli_refuses_a_lan_bind_before_loading_anything(capsys: pytest.CaptureFixture[str]) -> None:
    assert edgerun(["wyoming", "--uri", "tcp://0.0.0.0:10300"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--allow-lan" in err and "Traceback" not in err


# -- the service on the real models -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    root = tmp_path_factory.mktemp("wyoming-speech")
    synthesize(root / "calib", WAKE[:4] + OTHER[:5], [0.85, 1.0, 1.2])
    return {"root": [root],
            "wake": synthesize(root / "eval" / "alexa", WAKE[4:], [1.0], seed=1),  # held out of calibration
            "other": synthesize(root / "eval" / "other", OTHER[5:], [1.0], seed=1)}


@pytest.fixture(scope="module")
def wake_bundle(speech: dict[str, list[Path]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = speech["root"][0]
    out = tmp_path_factory.mktemp("wake") / "alexa-tflite-int8"
    assert edgerun(["convert", "audio", "zoo:openwakeword-alexa", "--calib", str(root / "calib"), "--eval", str(root / "eval"),
                    "--format", "tflite", "--quant", "int8", "--out", str(out)]) == 0
    return out


def _args(*argv: str) -> argparse.Namespace:
    from apps.cli.wyoming_cmd import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.fixture(scope="module")
def live(wake_bundle: Path) -> Iterator[LiveWyoming]:
    from apps.cli.wyoming_cmd import build_service

    service = build_service(_args("--wake-word", str(wake_bundle), "--memory", "2G", "--threads", "2"))
    service.preload()
    server = LiveWyoming(service)
    yield server
    server.stop()
    service.models.close()


@pytest.fixture(scope="module")
def judge():
    from tests.apps.voice.voice_audio import Judge

    return Judge()


@pytest.mark.slow
def test_describe_names_the_asr_tts_and_wake_programs(live: LiveWyoming) -> None:
    (event,) = talk(live.port, [Describe().event()], "info")
    info = Info.from_event(event)  # as Home Assistant parses it
    assert [m.name for p in info.asr for m in p.models] == ["whisper-tiny-en"]
    assert info.asr[0].models[0].languages == ["en"] and info.asr[0].installed
    assert [v.name for p in info.tts for v in p.voices] == ["piper-joe-medium"] and info.tts[0].supports_synthesize_streaming
    assert [(m.name, m.phrase) for p in info.wake for m in p.models] == [("alexa", "alexa")]
    assert "CC-BY-NC-SA" in info.wake[0].models[0].description  # the openWakeWord head's license travels with it


@pytest.mark.slow
def test_speech_in_transcript_out(live: LiveWyoming, speech: dict[str, list[Path]]) -> None:
    path = speech["other"][0]  # "Open the garage door." at Piper's 22.05 kHz: resampled by the server
    x, rate = _read_wav(path)
    assert rate == 22050
    want = _words(OTHER[5])
    got = talk(live.port, [Transcribe(language="en").event(), *_stream(x, rate)], "transcript")
    assert [e.type for e in got] == ["transcript"]
    heard = _words(Transcript.from_event(got[0]).text)
    assert len(set(heard) & set(want)) >= len(want) - 1, (heard, want)
    # 16 kHz, as Home Assistant sends it, and silence: an empty transcript is an answer, not an error
    x16 = resample(x, rate, 16000)
    silence = np.zeros(16000, np.float32)
    got = talk(live.port, [Transcribe().event(), *_stream(x16, 16000), Transcribe().event(), *_stream(silence, 16000)],
               "transcript")
    assert len(set(_words(Transcript.from_event(got[0]).text)) & set(want)) >= len(want) - 1


@pytest.mark.slow
def test_text_in_speech_out_is_heard_back(live: LiveWyoming, judge) -> None:
    text = "Turn on the kitchen lights. The weather is sunny today."
    got = talk(live.port, [Synthesize(text=text).event()], "audio-stop")
    assert got[0].type == "audio-start" and got[-1].type == "audio-stop"
    start = AudioStart.from_event(got[0])
    chunks = [AudioChunk.from_event(e) for e in got[1:-1]]
    assert chunks and all(c.rate == start.rate == 22050 and c.width == 2 and c.channels == 1 for c in chunks)
    pcm = b"".join(c.audio for c in chunks)
    assert all(len(c.audio) <= 2048 for c in chunks)
    x = np.frombuffer(pcm, "<i2").astype(np.float32) / 32768.0
    assert 2.0 < len(x) / start.rate < 10.0
    heard = _words(judge.transcribe(x, start.rate))
    want = _words(text)
    assert len(set(heard) & set(want)) >= len(want) - 2, (heard, want)


@pytest.mark.slow
def test_streamed_text_is_spoken_as_its_sentences_complete(live: LiveWyoming, judge) -> None:
    """Home Assistant streams an LLM's answer: synthesize-start, synthesize-chunk..., synthesize-stop, then the whole
    text once more in a synthesize event (for servers that do not stream), which must not be spoken twice."""
    pieces = ["The weather", " is sunny", " today. Turn", " on the kitchen", " lights."]

    async def conversation() -> tuple[list[Event], list[Event]]:
        async with AsyncTcpClient("127.0.0.1", live.port, read_timeout=60) as client:
            await client.write_event(SynthesizeStart().event())
            for piece in pieces[:3]:  # the first sentence is complete: its audio comes before the rest is sent
                await client.write_event(SynthesizeChunk(text=piece).event())
            first = [await client.read_event(), await client.read_event()]
            for piece in pieces[3:]:
                await client.write_event(SynthesizeChunk(text=piece).event())
            await client.write_event(SynthesizeStop().event())
            await client.write_event(Synthesize(text="".join(pieces)).event())
            await client.write_event(Describe().event())
            rest = []
            while not rest or rest[-1].type != "info":
                rest.append(await client.read_event())
        return first, rest

    first, rest = asyncio.run(conversation())
    assert [e.type for e in first] == ["audio-start", "audio-chunk"]
    types = [e.type for e in rest]
    assert types[-3:] == ["audio-stop", "synthesize-stopped", "info"] and set(types[:-3]) == {"audio-chunk"}, types
    pcm = b"".join(e.payload or b"" for e in [first[1], *rest[:-3]])
    rate = AudioStart.from_event(first[0]).rate
    heard, want = _words(judge.transcribe(np.frombuffer(pcm, "<i2").astype(np.float32) / 32768.0, rate)), _words("".join(pieces))
    assert len(set(heard) & set(want)) >= len(want) - 2 and len(heard) <= len(want) + 2, (heard, want)  # once, not twice


@pytest.mark.slow
def test_wake_word_stream_detection_and_not(live: LiveWyoming, speech: dict[str, list[Path]]) -> None:
    pad = np.zeros(16000, np.float32)
    for path in speech["wake"]:
        x, rate = _read_wav(path)
        clip = np.concatenate([pad, resample(x, rate, 16000), pad, pad])
        got = talk(live.port, [Detect(names=["alexa"]).event(), *_stream(clip, 16000)], "detection", "not-detected")
        assert got[-1].type == "detection", (path, got)
        detection = Detection.from_event(got[-1])
        # the word is said in the clip, after the leading second of silence; the detection comes as it is heard
        assert detection.name == "alexa" and 1000 <= detection.timestamp <= 1000 + 1000 * len(x) / rate, detection
    # at the clip's own 22.05 kHz, 8-bit: converted on the way by the wyoming package's converter
    x, rate = _read_wav(speech["wake"][0])
    clip8 = (np.clip(np.concatenate([np.zeros(rate, np.float32), x, np.zeros(2 * rate, np.float32)]), -1, 1) * 127 + 128)
    events = [Detect().event(), AudioStart(rate=rate, width=1, channels=1).event()]
    events += [AudioChunk(rate=rate, width=1, channels=1, audio=part.astype(np.uint8).tobytes()).event()
               for part in np.array_split(clip8, len(clip8) // 1024)]
    got = talk(live.port, [*events, AudioStop().event()], "detection", "not-detected")
    assert got[-1].type == "detection", got
    for path in speech["other"]:
        x, rate = _read_wav(path)
        got = talk(live.port, [Detect().event(), *_stream(np.concatenate([pad, resample(x, rate, 16000), pad]), 16000)],
                   "detection", "not-detected")
        assert [e.type for e in got] == ["not-detected"], (path, got)


@pytest.mark.slow
def test_clients_at_once_and_one_that_leaves_mid_answer(live: LiveWyoming, speech: dict[str, list[Path]]) -> None:
    """Connections are served at once (each model runs one request at a time); a client that goes away while its
    answer is spoken costs the others nothing."""
    clips = [_read_wav(p) for p in speech["other"][:2]]  # (the third says "forty two", which Whisper writes "42")

    async def leave_mid_answer() -> None:
        async with AsyncTcpClient("127.0.0.1", live.port) as client:
            await client.write_event(Synthesize(text="This answer is long. " * 40).event())
            await client.read_event()  # audio-start: it is speaking; leave

    async def transcribe(x: np.ndarray, rate: int) -> str:
        got = await _talk(live.port, [Transcribe().event(), *_stream(x, rate)], ("transcript",))
        return Transcript.from_event(got[-1]).text

    async def together() -> list[str]:
        results = await asyncio.gather(leave_mid_answer(), *(transcribe(x, rate) for x, rate in clips))
        return list(results[1:])

    texts = asyncio.run(together())
    for text, want in zip(texts, OTHER[5:7], strict=True):
        heard, words = _words(text), _words(want)
        assert len(set(heard) & set(words)) >= len(words) - 1, (heard, words)
    (event,) = talk(live.port, [Describe().event()], "info")
    assert event.type == "info"


def _error(event: Event) -> str:
    assert Error.is_type(event.type), event
    return Error.from_event(event).text


@pytest.mark.slow
def test_bad_input_is_one_error_and_the_connection_goes_on(live: LiveWyoming) -> None:
    tone = (0.3 * np.sin(np.arange(8000) * 2 * np.pi * 440 / 16000)).astype(np.float32)

    async def conversation() -> list[str]:
        errors: list[str] = []
        async with AsyncTcpClient("127.0.0.1", live.port, read_timeout=120) as client:
            async def expect_error(*events: Event) -> None:
                for e in events:
                    await client.write_event(e)
                errors.append(_error(await client.read_event()))

            await expect_error(Transcribe().event(), AudioStart(rate=0, width=2, channels=1).event())
            for e in _stream(tone, 16000)[1:]:  # the rest of the refused stream is dropped: no transcript
                await client.write_event(e)
            await expect_error(Transcribe().event(), AudioStart(rate=16000, width=5, channels=1).event())
            await client.write_event(AudioStop().event())
            await expect_error(Transcribe().event(), AudioStart(rate=16000, width=2, channels=6).event())
            await client.write_event(AudioStop().event())
            await expect_error(Transcribe().event(), AudioStart(rate=16000, width=2, channels=1).event(),
                               AudioChunk(rate=16000, width=2, channels=1, audio=b"\x00\x01\x02").event())
            await client.write_event(AudioStop().event())
            await expect_error(Transcribe().event(), AudioStart(rate=16000, width=2, channels=1).event(),
                               AudioChunk(rate=16000, width=2, channels=1, audio=_pcm16(tone)).event(),
                               AudioChunk(rate=48000, width=2, channels=1, audio=_pcm16(tone)).event())
            await client.write_event(AudioStop().event())
            await expect_error(Event(type="audio-chunk", data={"width": 2, "channels": 1}, payload=b"\x00\x00"))
            await expect_error(Transcribe(language="de").event())
            await expect_error(Synthesize(text="x" * 4001).event())
            await expect_error(Detect(names=["hey_jarvis"]).event())
            # 61 s of audio in one transcribe request: refused once it passes the limit, the rest dropped
            long = _stream(np.zeros(61 * 16000, np.float32), 16000, samples=16000)
            await expect_error(Transcribe().event(), *long[:-1])
            await client.write_event(long[-1])
            # after all that, the same connection still answers, and a good stream still transcribes
            await client.write_event(Describe().event())
            assert (await client.read_event()).type == "info"
            # width 1 (unsigned 8-bit) stereo at 8 kHz is converted, not refused
            stereo8 = np.repeat(((resample(tone, 16000, 8000) * 127) + 128).astype(np.uint8), 2).tobytes()
            for e in (Transcribe().event(), AudioStart(rate=8000, width=1, channels=2).event(),
                      AudioChunk(rate=8000, width=1, channels=2, audio=stereo8).event(), AudioStop().event()):
                await client.write_event(e)
            assert (await client.read_event()).type == "transcript"
        return errors

    errors = asyncio.run(conversation())
    expected = ["audio rate 0 is not valid", "audio width 5 is not valid", "audio channels 6 is not valid",
                "not whole frames of 2 bytes", "one stream keeps one format", "missing field 'rate'",
                "language 'de' is not served", "at most 4000", "'hey_jarvis' is not served", "longer than 60 s"]
    assert len(errors) == len(expected)
    for text, want in zip(errors, expected, strict=True):
        assert want in text and "\n" not in text, (text, want)


@pytest.mark.slow
@pytest.mark.parametrize("header, message", [
    ({"type": "audio-chunk", "payload_length": MAX_EVENT_BYTES + 1}, "over the 1048576 byte limit"),
    ({"type": "synthesize", "data_length": 10 * MAX_EVENT_BYTES}, "over the 1048576 byte limit"),
    ({"type": "audio-chunk", "payload_length": "many"}, "is not a byte count"),
    ({"data": {}}, "has no type"),
    ("not json", "not JSON"),
])
def test_an_event_that_cannot_be_read_closes_the_connection_with_one_error(live: LiveWyoming, header: object,
                                                                           message: str) -> None:
    async def conversation() -> tuple[Event | None, Event | None]:
        reader, writer = await asyncio.open_connection("127.0.0.1", live.port)
        line = header if isinstance(header, str) else json.dumps(header)
        writer.write(line.encode() + b"\n")
        await writer.drain()
        client = AsyncTcpClient("127.0.0.1", live.port, read_timeout=30)
        client._reader, client._writer = reader, writer  # the package's reader on this raw connection
        first, second = await client.read_event(), await client.read_event()
        writer.close()
        return first, second

    first, second = asyncio.run(conversation())
    assert first is not None and message in _error(first)
    assert second is None  # closed: the stream cannot be resynchronised after an unread body
    (event,) = talk(live.port, [Describe().event()], "info")  # the server goes on
    assert event.type == "info"


@pytest.mark.slow
def test_edgerun_wyoming_command_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "wyoming.log"
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "apps", "wyoming", "--uri", f"tcp://127.0.0.1:{port}", "--no-tts",
                                 "--threads", "1"], cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 120
        while "serving Wyoming" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        (event,) = talk(port, [Describe().event()], "info")
        info = Info.from_event(event)
        assert [m.name for p in info.asr for m in p.models] == ["whisper-tiny-en"] and not info.tts and not info.wake
        (event,) = talk(port, [Synthesize(text="hello").event()], "audio-start")
        assert "does not synthesize" in _error(event)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert "Wyoming server stopped" in text and "Traceback" not in text, text
