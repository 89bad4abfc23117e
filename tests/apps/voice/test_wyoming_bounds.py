"""The Wyoming server's bounds on what clients hold, spoken to with the ``wyoming`` package's own client on loopback:
a connection limit, an idle deadline, audio kept at 16 kHz as it arrives (measured with tracemalloc), and model
calls and resampling off the event loop, one worker per model, so that a slow transcription or a long request at a
high rate does not stall another satellite's wake-word detection.

The bounds themselves need no model (a service that offers speech-to-text answers ``ping`` without loading it); the
stall tests run the real Whisper and the real "alexa" bundle (the session fixtures of voice_audio.py).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe
from wyoming.ping import Ping
from wyoming.wake import Detect

from apps.cli import main as edgerun
from apps.voice.wyoming_server import IDLE_SECONDS, MAX_CONNECTIONS, MAX_TRANSCRIBE_SECONDS, Served, WyomingService
from runtime.errors import BadInput
from runtime.speech.resample import Resampler, resample
from scripts import make_voice_audio as mva
from tests.apps.voice.test_wyoming import LiveWyoming, _args, _pcm16, _read_wav, _stream
from tests.apps.voice.voice_audio import voice_corpus, wake_bundle  # noqa: F401  (session fixtures)

HIGH = 384_000  # the highest rate the server takes (runtime.formats.wav.MAX_RATE)


@pytest.fixture
def bare() -> Iterator[tuple[WyomingService, LiveWyoming]]:
    """A server offering speech-to-text with no model behind it: what the bounds need (tests set them on the
    service before connecting)."""
    service = WyomingService(None, asr=Served("asr"))
    server = LiveWyoming(service)
    yield service, server
    server.stop()
    service.close()


def _client(port: int, timeout: float = 15.0) -> AsyncTcpClient:
    return AsyncTcpClient("127.0.0.1", port, read_timeout=timeout)


async def _pong(client: AsyncTcpClient) -> None:
    await client.write_event(Ping(text="hi").event())
    event = await client.read_event()
    assert event is not None and event.type == "pong", event


async def _until_closed(service: WyomingService, open_: int = 0, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while service.connections > open_:
        assert time.monotonic() < deadline, f"{service.connections} connections still open"
        await asyncio.sleep(0.02)


def _error(event: Event | None) -> Error:
    assert event is not None and Error.is_type(event.type), event
    return Error.from_event(event)


# -- no model needed ----------------------------------------------------------------------------------------------

def test_cli_defaults_are_the_servers_and_bad_bounds_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    args = _args()
    assert (args.max_connections, args.max_audio_seconds, args.idle_timeout) == (MAX_CONNECTIONS, MAX_TRANSCRIBE_SECONDS,
                                                                                 IDLE_SECONDS)
    for flag, value in (("--max-connections", "0"), ("--max-audio-seconds", "nan"), ("--idle-timeout", "-1")):
        assert edgerun(["wyoming", flag, value]) == 2  # refused by argparse, before anything loads
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert flag in err and "use" in err and "Traceback" not in err, err
    for bad in ({"max_connections": 0}, {"max_connections": 2.5}, {"idle_seconds": float("inf")},
                {"max_transcribe_seconds": -1}):
        with pytest.raises(BadInput, match=next(iter(bad))):
            WyomingService(None, asr=Served("asr"), **bad)


def test_a_connection_over_the_limit_gets_one_error_and_is_closed(bare: tuple[WyomingService, LiveWyoming]) -> None:
    service, server = bare
    service.max_connections = 2

    async def conversation() -> None:
        async with _client(server.port) as a, _client(server.port) as b:
            await _pong(a)
            await _pong(b)
            async with _client(server.port) as c:
                refused = _error(await c.read_event())
                assert refused.code == "busy" and "--max-connections 2" in refused.text and "\n" not in refused.text
                assert await c.read_event() is None  # closed
            await _pong(a)  # the two admitted go on
        await _until_closed(service)
        async with _client(server.port) as d:  # the slots are free again
            await _pong(d)

    asyncio.run(conversation())


# (what the client sends, then nothing more; what the error says): a silent client, half a header, half a payload
IDLE = [(b"", "no event for 1 s"),
        (b'{"type": "ping", "da', "no event for 1 s"),
        (json.dumps({"type": "audio-chunk", "payload_length": 100}).encode() + b"\n" + b"x" * 10, "100 bytes")]


@pytest.mark.parametrize("sent, message", IDLE, ids=["silent", "half-header", "half-payload"])
def test_a_connection_that_stalls_is_closed_after_the_idle_limit(bare: tuple[WyomingService, LiveWyoming], sent: bytes,
                                                                 message: str) -> None:
    service, server = bare
    service.idle_seconds = 1.0

    async def conversation() -> tuple[Event | None, Event | None, float]:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        start = time.monotonic()
        writer.write(sent)
        await writer.drain()
        client = _client(server.port)
        client._reader, client._writer = reader, writer  # the package's reader on this raw connection
        first, second = await client.read_event(), await client.read_event()
        writer.close()
        return first, second, time.monotonic() - start

    first, second, elapsed = asyncio.run(conversation())
    error = _error(first)
    assert error.code == "timeout" and message in error.text and "--idle-timeout" in error.text, error
    assert second is None and 0.9 <= elapsed < 10.0, elapsed
    asyncio.run(_until_closed(service))


def test_the_idle_limit_is_per_event_not_per_connection(bare: tuple[WyomingService, LiveWyoming]) -> None:
    service, server = bare
    service.idle_seconds = 1.0

    async def conversation() -> None:
        async with _client(server.port) as client:
            for _ in range(8):  # 2.4 s in all, never 1 s without an event
                await _pong(client)
                await asyncio.sleep(0.3)
            await _pong(client)

    asyncio.run(conversation())


def _held_after(server: LiveWyoming, rate: int, seconds: float) -> int:
    """Bytes the server holds more than before (tracemalloc, every thread) once one connection has sent ``seconds``
    of 16-bit mono noise at ``rate`` for a transcribe request, before its audio-stop."""
    noise = _pcm16(np.random.default_rng(0).normal(0.0, 0.1, rate // 2))  # one 0.5 s chunk, sent again and again

    async def conversation() -> int:
        async with _client(server.port) as client:
            await _pong(client)  # connected and admitted before the baseline
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            await client.write_event(Transcribe().event())
            await client.write_event(AudioStart(rate=rate, width=2, channels=1).event())
            for _ in range(int(seconds * 2)):
                await client.write_event(AudioChunk(rate=rate, width=2, channels=1, audio=noise).event())
            await _pong(client)  # every chunk handled: events are handled in order
            gc.collect()
            return tracemalloc.get_traced_memory()[0] - before

    return asyncio.run(conversation())


def test_audio_is_held_at_16_khz_whatever_rate_it_arrives_at(bare: tuple[WyomingService, LiveWyoming]) -> None:
    """59 s at 384 kHz was held as 45 MB of 16-bit PCM at 384 kHz until audio-stop; now as 16 kHz (1.9 MB) and the
    resampler's window (1.5 s at 384 kHz in float32: 2.3 MB)."""
    service, server = bare
    seconds = 59.0
    tracemalloc.start()
    try:
        held = {rate: _held_after(server, rate, seconds) for rate in (16000, HIGH)}
        asyncio.run(_until_closed(service))
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    at_16k = seconds * 16000 * 2
    assert at_16k * 0.9 < held[16000] < at_16k * 1.3 + (256 << 10), held
    window = int(1.5 * HIGH * 4)  # apps.voice.wyoming_audio.STREAM_CHUNK_SECONDS and its two 0.5 s margins
    assert held[HIGH] < held[16000] + window + (512 << 10), (held, f"the input at 384 kHz is {seconds * HIGH * 2:.0f} B")
    assert after < (1 << 20) + min(held.values()), after  # a closed connection's audio is gone with it


def test_a_streamed_resample_is_the_whole_clips() -> None:
    """The server's resampler, fed chunk by chunk, gives what the whole-clip resampler gives (same chunking), and with
    its shorter chunk stays within runtime/speech/resample.py's stated tolerance for speech-band content."""
    rng = np.random.default_rng(3)
    t = np.arange(int(3.3 * 44100)) / 44100
    x = (0.3 * np.sin(2 * np.pi * 300 * t) + 0.1 * np.sin(2 * np.pi * 2500 * t)) * np.clip(np.minimum(t, t[-1] - t) / 0.3, 0, 1)
    x = (x + rng.normal(0, 1e-4, len(x))).astype(np.float32)
    whole = resample(x, 44100, 16000)
    for chunk_s, tol in ((2.0, 0.0), (0.5, 5e-5)):
        stream = Resampler(44100, 16000, chunk_s)
        held = 0
        parts = []
        for i in range(0, len(x), 1001):
            parts.append(stream.feed(x[i : i + 1001]))
            held = max(held, stream.held_bytes)
        y = np.concatenate([*parts, stream.finish()])
        assert len(y) == len(whole) and np.abs(y - whole).max() <= tol, chunk_s
        assert held <= (chunk_s + 1.0) * 44100 * 4 + 1001 * 4  # one chunk and its margins, whatever the clip's length


# -- the real models: a slow request costs the other clients nothing ----------------------------------------------

@pytest.fixture(scope="module")
def served(wake_bundle: Path) -> Iterator[tuple[WyomingService, LiveWyoming]]:  # noqa: F811
    from apps.cli.wyoming_cmd import build_service

    service = build_service(_args("--no-tts", "--wake-word", str(wake_bundle), "--memory", "2G", "--threads", "2",
                                  "--max-connections", "40", "--max-audio-seconds", "120"))
    service.preload()
    server = LiveWyoming(service)
    yield service, server
    server.stop()
    service.close()
    service.models.close()


def _wake_clip(corpus: mva.Corpus) -> np.ndarray:
    clip = corpus.of("wake", voice="piper-joe")[0]
    x, rate = _read_wav(corpus.path(clip))
    pad = mva.floor_noise(mva.silence(1.0, 16000), 0)
    return np.concatenate([pad, resample(x, rate, 16000), pad, pad])


@pytest.mark.slow
def test_a_slow_transcription_does_not_stall_wake_detection(served: tuple[WyomingService, LiveWyoming],
                                                            voice_corpus: mva.Corpus,  # noqa: F811
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """More transcriptions wait on a slow transcriber than a pool shared by every model has threads (asyncio's
    default: min(32, CPUs + 4)); meanwhile another satellite's wake word is still detected, and describe answered,
    within a bound. Then the transcriber is released and every transcription is answered."""
    service, server = served
    release, entered = threading.Event(), []

    def slow(samples: np.ndarray) -> str:  # the real call's signature; as slow as the test wants
        entered.append(len(samples))
        assert release.wait(120), "never released"
        return "slow"

    monkeypatch.setattr(service, "transcribe", slow)
    waiting = min(32, (os.cpu_count() or 1) + 4) + 1
    request = [Transcribe().event(), *_stream(np.full(1600, 0.01, np.float32), 16000)]
    wake = [Detect(names=["alexa"]).event(), *_stream(_wake_clip(voice_corpus), 16000)]

    async def transcribe(sent: asyncio.Event) -> str:
        async with _client(server.port, timeout=150) as client:
            for event in request:
                await client.write_event(event)
            sent.set()
            event = await client.read_event()
            assert event is not None and event.type == "transcript", event
            return Transcript.from_event(event).text

    async def answered(events: list[Event], until: str) -> float:
        start = time.monotonic()
        async with _client(server.port, timeout=30) as client:
            for event in events:
                await client.write_event(event)
            while (event := await client.read_event()) is not None and event.type not in (until, "not-detected", "error"):
                pass
        assert event is not None and event.type == until, event
        return time.monotonic() - start

    async def together() -> tuple[float, float, list[str]]:
        sent = [asyncio.Event() for _ in range(waiting)]
        tasks = [asyncio.create_task(transcribe(s)) for s in sent]
        try:
            await asyncio.wait_for(asyncio.gather(*(s.wait() for s in sent)), 30)
            await asyncio.sleep(1.0)  # the server has read every audio-stop: the transcriptions wait
            assert entered, "no transcription started"
            detect_s = await answered(wake, "detection")
            describe_s = await answered([Describe().event()], "info")
        finally:
            release.set()
        return detect_s, describe_s, await asyncio.wait_for(asyncio.gather(*tasks), 120)

    try:
        detect_s, describe_s, texts = asyncio.run(together())
    finally:
        release.set()
    assert texts == ["slow"] * waiting
    assert detect_s < 30 and describe_s < 5, (detect_s, describe_s)


@pytest.mark.slow
def test_a_long_high_rate_request_leaves_the_event_loop_free(served: tuple[WyomingService, LiveWyoming]) -> None:
    """120 s at 384 kHz (92 MB of PCM) for one transcription: the event loop, which every client's events go through,
    never stops for more than a fraction of a second. It stopped for the whole request's resampling at audio-stop
    (1.4 s here, more on a slower CPU)."""
    _, server = served
    gaps: list[float] = []
    stop = asyncio.Event()

    async def heartbeat() -> None:  # on the server's loop: how late each 10 ms tick comes
        last = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    beat = asyncio.run_coroutine_threadsafe(heartbeat(), server.loop)
    chunk = _pcm16(np.random.default_rng(1).normal(0.0, 3e-4, HIGH // 2))  # a quiet room: Whisper hears nothing

    async def conversation() -> Event | None:
        async with _client(server.port, timeout=120) as client:
            await client.write_event(Transcribe().event())
            await client.write_event(AudioStart(rate=HIGH, width=2, channels=1).event())
            for _ in range(240):
                await client.write_event(AudioChunk(rate=HIGH, width=2, channels=1, audio=chunk).event())
            await client.write_event(AudioStop().event())
            return await client.read_event()

    try:
        event = asyncio.run(conversation())
    finally:
        server.loop.call_soon_threadsafe(stop.set)
        beat.result(30)
    assert event is not None and event.type == "transcript", event
    assert gaps and max(gaps) < 0.5, f"the event loop stopped for {max(gaps):.2f} s"
