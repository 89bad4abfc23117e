"""Wyoming services (the protocol Home Assistant speaks) from edgerun's resident models.

One server answers, on one port, what Home Assistant's Wyoming integration asks of the separate
wyoming-faster-whisper, wyoming-piper and wyoming-openwakeword services, from the models that one
:class:`runtime.residency.manager.ResidencyManager` holds under one memory plan:

* ``describe`` -> ``info`` naming the served ``asr``, ``tts`` and ``wake`` programs and their models;
* ``transcribe``, ``audio-start``, ``audio-chunk``..., ``audio-stop`` -> ``transcript``;
* ``synthesize`` -> ``audio-start``, ``audio-chunk``..., ``audio-stop`` (16-bit mono at the voice's rate),
  sentence by sentence as the voice speaks them; streamed text (``synthesize-start``, ``synthesize-chunk``...,
  ``synthesize-stop``, as Home Assistant sends an LLM's answer) is spoken a sentence at a time as its sentences
  complete (apps.voice.sentences), then ``synthesize-stopped``; the whole text that such a client also sends in one
  ``synthesize`` event is not spoken twice;
* ``detect``, ``audio-start``, ``audio-chunk``... -> ``detection`` as soon as the wake word is heard (once per
  stream, as Home Assistant reads it), ``not-detected`` at ``audio-stop`` when it was not;
* ``ping`` -> ``pong``.

The events, the framing, the server and the audio conversion are the ``wyoming`` package's own classes. Bad
input (a rate, width or channel count the converter cannot take, a stream that changes format, audio longer than
:data:`MAX_TRANSCRIBE_SECONDS`, text longer than :data:`MAX_SYNTHESIZE_CHARS`, an event missing a field) is
answered with one ``error`` event naming what is wrong and what is valid, and the connection goes on. An event
whose header or body is over :data:`MAX_EVENT_BYTES`, or whose header is not a Wyoming header, is refused before it
is read: the client gets one ``error`` event and the connection closes (the stream cannot be resynchronised).

Bounds on what clients hold: at most :data:`MAX_CONNECTIONS` connections (one more gets an ``error`` event, code
``busy``, and is closed); a connection that sends nothing, or stops half way through an event, for
:data:`IDLE_SECONDS` gets an ``error`` event (code ``timeout``) and is closed. Audio to transcribe is kept at 16 kHz
as it arrives (apps/voice/wyoming_audio.py); resampling and every model call run in worker threads, one per model,
so the event loop, and the other clients' requests to other models, never wait for them.

Wyoming has no authentication: bind to the loopback address (the default) unless the network is trusted
(:func:`check_uri`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import numpy as np
from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioChunkConverter, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import AsrModel, AsrProgram, Attribution, Describe, Info, TtsProgram, TtsVoice, WakeModel, WakeProgram
from wyoming.ping import Ping, Pong
from wyoming.server import AsyncEventHandler, AsyncServer
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped, SynthesizeVoice
from wyoming.wake import Detect, Detection, NotDetected

from apps.voice.sentences import SentenceCutter
from apps.voice.types import SAMPLE_RATE
from apps.voice.wake import WakeStream
from apps.voice.wyoming_audio import SpeechBuffer, Workers
from apps.voice.wyoming_reader import CheckedReader
from runtime.errors import BadInput, EdgerunError, one_line
from runtime.formats.wav import MAX_RATE, MIN_RATE
from runtime.speech.resample import resample
from runtime.speech.tts import MAX_CHARS as TTS_MAX_CHARS

log = logging.getLogger(__name__)

DEFAULT_URI = "tcp://127.0.0.1:10300"
MAX_EVENT_BYTES = 1 << 20  # an event's header, data or payload (Home Assistant sends 2 KiB audio chunks)
MAX_TRANSCRIBE_SECONDS = 60.0  # one transcribe request's audio (a voice command is a few seconds)
MAX_SYNTHESIZE_CHARS = TTS_MAX_CHARS  # one synthesize request's text
# Connections at once: Home Assistant opens one per request (a satellite streams to wake, then speech-to-text, then
# text-to-speech), so a house of satellites needs a few; each may hold a request's audio (a few MB at most).
MAX_CONNECTIONS = 16
IDLE_SECONDS = 300.0  # a connection that sends nothing (or half an event) this long is closed; satellites reconnect
CHUNK_SAMPLES = 1024  # audio-chunk size of synthesized speech (as wyoming-piper sends)
EDGERUN = Attribution(name="edgerun", url="")  # the program (no public URL); models name their own makers


class RequestError(EdgerunError):
    """A request the server refuses: answered with one Wyoming ``error`` event (``code``), the connection goes on."""

    def __init__(self, message: str, code: str = "bad-input") -> None:
        super().__init__(message)
        self.code = code


# -- the models, behind the residency manager ---------------------------------------------------------------------

@dataclass(frozen=True)
class Served:
    """A served model: ``name`` in the residency manager; ``public``: the name info shows and requests use
    (default ``name``); what else info says about it."""

    name: str
    public: str = ""
    description: str = ""
    languages: tuple[str, ...] = ("en",)
    attribution: Attribution | None = None  # who made the model (None: edgerun)
    phrase: str | None = None  # wake words: what is said

    @property
    def shown(self) -> str:
        return self.public or self.name


class WyomingService:
    """What every connection shares: the residency manager, the served models, their info, one inference lock and
    one worker thread each, and the count of open connections.

    ``asr``, ``tts``, ``wake``: the served models (None: that service is not offered). Model calls block; the
    handlers run them in the model's worker thread, one at a time per model (on a small CPU two at once only share
    the cores), and resampling in one more (:class:`apps.voice.wyoming_audio.Workers`). :meth:`close` ends them."""

    def __init__(self, models: Any, *, asr: Served | None = None, tts: Served | None = None, wake: Served | None = None,
                 max_transcribe_seconds: float = MAX_TRANSCRIBE_SECONDS, max_synthesize_chars: int = MAX_SYNTHESIZE_CHARS,
                 max_event_bytes: int = MAX_EVENT_BYTES, max_connections: int = MAX_CONNECTIONS,
                 idle_seconds: float = IDLE_SECONDS) -> None:
        if asr is None and tts is None and wake is None:
            raise BadInput("a Wyoming server needs at least one of speech-to-text, text-to-speech or a wake word")
        if isinstance(max_connections, bool) or not isinstance(max_connections, int) or max_connections < 1:
            raise BadInput(f"Wyoming server: max_connections {max_connections!r} is not an integer >= 1")
        for name, value in (("max_transcribe_seconds", max_transcribe_seconds), ("idle_seconds", idle_seconds)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
                raise BadInput(f"Wyoming server: {name} {value!r} is not a number of seconds > 0")
        self.models, self.asr, self.tts, self.wake = models, asr, tts, wake
        self.max_transcribe_seconds, self.max_synthesize_chars = max_transcribe_seconds, max_synthesize_chars
        self.max_event_bytes, self.max_connections, self.idle_seconds = max_event_bytes, max_connections, idle_seconds
        self._locks = {s.name: threading.Lock() for s in (asr, tts, wake) if s is not None}
        self.workers = Workers(("asr", "tts", "wake", "audio"))  # threads start with their first call
        self.connections = 0  # open connections (counted on the event loop)

    def close(self) -> None:
        """End the worker threads (after the calls under way); the residency manager is the caller's to close."""
        self.workers.close()

    def preload(self) -> None:
        """Load every served model now (the first request then does not wait for a load)."""
        for served in (self.asr, self.tts, self.wake):
            if served is not None:
                with self.models.acquire(served.name):
                    pass

    def handler(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> WyomingHandler:
        return WyomingHandler(self, reader, writer)

    def info(self) -> Info:
        version = _version()
        info = Info()
        if self.asr is not None:
            a = self.asr
            info.asr.append(AsrProgram(
                name="edgerun-asr", attribution=EDGERUN, installed=True, version=version,
                description="edgerun speech-to-text (faster-whisper, CTranslate2 INT8 on the CPU)",
                models=[AsrModel(**_described(a))]))
        if self.tts is not None:
            t = self.tts
            info.tts.append(TtsProgram(
                name="edgerun-tts", attribution=EDGERUN, installed=True, version=version,
                description="edgerun text-to-speech", supports_synthesize_streaming=True,
                voices=[TtsVoice(**_described(t))]))
        if self.wake is not None:
            w = self.wake
            info.wake.append(WakeProgram(
                name="edgerun-wake", attribution=EDGERUN, installed=True, version=version,
                description="edgerun wake-word detection (openWakeWord front end and head)",
                models=[WakeModel(**_described(w), phrase=w.phrase or w.shown)]))
        return info

    # -- model calls (blocking: run in worker threads) ----------------------------------------------------------
    def transcribe(self, samples: np.ndarray) -> str:
        """Text of ``samples`` (float32 mono at SAMPLE_RATE); the language was checked against the model's."""
        assert self.asr is not None
        with self.models.acquire(self.asr.name) as asr, self._locks[self.asr.name]:
            return _asr_text(asr, samples)

    def synthesize(self, text: str, stop: threading.Event) -> Iterator[tuple[np.ndarray, int]]:
        """(float32 samples, rate) pieces of ``text`` spoken, as the voice makes them; ends early once ``stop`` is set."""
        assert self.tts is not None
        with self.models.acquire(self.tts.name) as tts, self._locks[self.tts.name]:
            for samples, rate in _tts_pieces(tts, text):
                if stop.is_set():
                    return
                yield samples, rate

    def wake_stream(self) -> WakeStream:
        """A new stream's wake-word state (apps/voice/wake.py: the assistant's own detector); its ``rate`` is the
        model's."""
        assert self.wake is not None
        with self.models.acquire(self.wake.name) as detector, self._locks[self.wake.name]:
            return WakeStream(detector)

    def detect(self, listener: WakeStream, samples: np.ndarray, final: bool) -> list[float]:
        """Seconds from the stream's start at which the wake word ends, for each detection the samples complete."""
        assert self.wake is not None
        with self.models.acquire(self.wake.name) as detector, self._locks[self.wake.name]:
            return [hit.at_s for hit in listener.feed(detector, samples, final=final)]


# -- the speech models (runtime.speech.asr.ASR, runtime.speech.tts voices): the two calls the server makes ---------------------------------

def _asr_text(asr: Any, samples: np.ndarray) -> str:
    result = asr.transcribe(samples)
    text = result if isinstance(result, str) else getattr(result, "text", "")
    return str(text).strip()


def _tts_pieces(tts: Any, text: str) -> Iterator[tuple[np.ndarray, int]]:
    for chunk in tts.speak(text):  # runtime.speech.tts: a SpeechChunk per sentence
        yield np.asarray(chunk.samples, np.float32), int(chunk.rate)


def _described(m: Any) -> dict[str, Any]:
    """The fields every Wyoming model or voice description has, from a served model's description."""
    return {"name": m.shown, "attribution": m.attribution or EDGERUN, "installed": True,
            "description": m.description or m.shown, "version": None, "languages": list(m.languages)}


def _version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("edgerun")
    except PackageNotFoundError:
        return None


# -- one connection ---------------------------------------------------------------------------------------------

@dataclass
class _Stream:
    """One audio stream (audio-start ... audio-stop) and what it is for."""

    purpose: str  # "transcribe" | "detect"
    fmt: tuple[int, int, int] | None = None  # rate, width, channels (fixed by audio-start or the first chunk)
    converter: AudioChunkConverter | None = None  # detect: to the wake model's format
    audio: SpeechBuffer | None = None  # transcribe: the audio so far, at 16 kHz (None once refused as too long)
    listener: WakeStream | None = None
    detected: bool = False
    refused: bool = False  # refused once: the rest of the stream is dropped until audio-stop
    language: str | None = None


class WyomingHandler(AsyncEventHandler):
    """One client connection: its events in order, one request at a time."""

    def __init__(self, service: WyomingService, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        super().__init__(reader, writer)
        self.service = service
        self._checked = CheckedReader(reader, service.max_event_bytes, service.idle_seconds)
        self.reader = self._checked  # type: ignore[assignment]  # what AsyncEventHandler.run reads events from
        self._request: _Stream | None = None
        self._synth: _AudioOut | None = None  # a streamed synthesis (synthesize-start ... synthesize-stop)
        self._compat_synthesize = False

    async def run(self) -> None:
        s = self.service
        if s.connections >= s.max_connections:  # refused before anything is read: it holds nothing
            log.warning("wyoming: refused a connection: %d open, the limit", s.connections)
            with contextlib.suppress(ConnectionError, RuntimeError):
                await self.write_event(Error(text=f"the server has {s.connections} connections open, its limit "
                                                  f"(--max-connections {s.max_connections}); try again when one closes",
                                             code="busy").event())
            self.writer.close()
            return
        s.connections += 1
        try:
            await super().run()
        except (asyncio.IncompleteReadError, ConnectionError) as exc:  # the client went away mid-event
            log.info("wyoming: client went away: %s", one_line(exc))
        except Exception as exc:  # an event body the package cannot parse: the connection is closed
            log.warning("wyoming: closed a connection on a malformed event: %s", one_line(exc))
        finally:
            s.connections -= 1
            self._request = None  # the audio a request held goes now, not when the handler is collected

    async def disconnect(self) -> None:
        if self._checked.refused:
            log.warning("wyoming: closing a connection: %s", self._checked.refused)
            try:
                await self.write_event(Error(text=self._checked.refused, code=self._checked.code).event())
            except (ConnectionError, RuntimeError):
                pass

    async def handle_event(self, event: Event) -> bool:
        try:
            await self._handle(event)
        except RequestError as exc:
            await self._error(event, str(exc), exc.code)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a field missing or of the wrong type
            what = f"missing field {exc}" if isinstance(exc, KeyError) else one_line(exc)
            await self._error(event, f"{event.type} event: {what}", "bad-input")
        except ConnectionError as exc:  # the client went away while being answered: nobody to tell
            log.info("wyoming: client went away during %s: %s", event.type, one_line(exc))
            return False
        except Exception as exc:  # a model that cannot load or run: reported, the connection goes on
            log.warning("wyoming: %s failed: %s", event.type, one_line(exc))
            await self._error(event, f"{event.type} failed: {one_line(exc)}", "model-error")
        return True

    async def _error(self, event: Event, text: str, code: str) -> None:
        """One error event; an audio stream it concerns is dropped until its audio-stop."""
        if self._request is not None and event.type.startswith("audio-"):
            self._request.refused = True
        await self.write_event(Error(text=text, code=code).event())

    async def _handle(self, event: Event) -> None:
        s = self.service
        if Describe.is_type(event.type):
            await self.write_event(s.info().event())
        elif Ping.is_type(event.type):
            await self.write_event(Pong(text=Ping.from_event(event).text).event())
        elif Transcribe.is_type(event.type):
            self._request = None
            request = Transcribe.from_event(event)
            self._check_asr(request.language, request.name)
            self._request = _Stream("transcribe", language=request.language)
        elif Detect.is_type(event.type):
            self._request = None
            self._check_wake(Detect.from_event(event).names)
            self._request = _Stream("detect")
        elif AudioStart.is_type(event.type):
            start = AudioStart.from_event(event)
            stream = self._stream_for_audio()
            if stream.fmt is not None or stream.refused:  # a second audio-start: a new stream for the same request
                stream = self._request = _Stream(stream.purpose, language=stream.language)
            await self._begin(stream, start.rate, start.width, start.channels)
        elif AudioChunk.is_type(event.type):
            await self._chunk(AudioChunk.from_event(event))
        elif AudioStop.is_type(event.type):
            stream, self._request = self._request, None
            if stream is not None and not stream.refused:
                await self._finish(stream)
        elif Synthesize.is_type(event.type):
            await self._synthesize(Synthesize.from_event(event))
        elif SynthesizeStart.is_type(event.type):
            await self._synthesize_start(SynthesizeStart.from_event(event))
        elif SynthesizeChunk.is_type(event.type):
            await self._synthesize_chunk(SynthesizeChunk.from_event(event))
        elif SynthesizeStop.is_type(event.type):
            await self._synthesize_stop()
        else:
            log.debug("wyoming: ignoring a %s event", event.type)

    # -- requests ---------------------------------------------------------------------------------------------
    def _check_asr(self, language: str | None, name: str | None) -> None:
        asr = self.service.asr
        if asr is None:
            raise RequestError("this server does not transcribe (started without speech-to-text)", "not-served")
        if name is not None and name != asr.shown:
            raise RequestError(f"speech-to-text model {name!r} is not served (served: {asr.shown})", "not-served")
        if language is not None and language.split("-")[0].split("_")[0].lower() not in asr.languages:
            raise RequestError(f"speech-to-text language {language!r} is not served ({asr.shown} takes: "
                               f"{', '.join(asr.languages)})", "not-served")

    def _check_wake(self, names: list[str] | None) -> None:
        wake = self.service.wake
        if wake is None:
            raise RequestError("this server does not detect wake words (started without --wake-word)", "not-served")
        if names and wake.shown not in names and (wake.phrase or "") not in names:
            raise RequestError(f"wake word {', '.join(map(repr, names))} is not served (served: {wake.shown})", "not-served")

    def _stream_for_audio(self) -> _Stream:
        if self._request is None:  # audio with no request: speech-to-text, as wyoming-faster-whisper does
            self._check_asr(None, None)
            self._request = _Stream("transcribe")
        return self._request

    async def _begin(self, stream: _Stream, rate: Any, width: Any, channels: Any) -> None:
        for name, value, lo, hi, valid in (("rate", rate, MIN_RATE, MAX_RATE, f"{MIN_RATE}..{MAX_RATE} Hz"),
                                           ("width", width, 1, 4, "1..4 bytes per sample"),
                                           ("channels", channels, 1, 2, "1 (mono) or 2 (stereo)")):
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                stream.refused = True
                raise RequestError(f"audio {name} {value!r} is not valid ({valid}; Home Assistant sends 16000 Hz, "
                                   "2 bytes, mono)")
        stream.fmt = (rate, width, channels)
        if stream.purpose == "transcribe":
            stream.audio = SpeechBuffer(rate, width, channels)
        else:
            stream.listener = await self.service.workers.submit("wake", self.service.wake_stream)
            stream.converter = AudioChunkConverter(rate=stream.listener.rate, width=2, channels=1)

    async def _chunk(self, chunk: AudioChunk) -> None:
        stream = self._stream_for_audio()
        if stream.refused:
            return
        if stream.fmt is None:  # no audio-start: the first chunk sets the format
            await self._begin(stream, chunk.rate, chunk.width, chunk.channels)
        if (chunk.rate, chunk.width, chunk.channels) != stream.fmt:
            raise RequestError(f"an audio chunk of {chunk.rate} Hz, {chunk.width} bytes, {chunk.channels} channels in a "
                               f"stream of {stream.fmt[0]} Hz, {stream.fmt[1]} bytes, {stream.fmt[2]} channels; one stream "
                               "keeps one format")
        frame = chunk.width * chunk.channels
        if len(chunk.audio) % frame:
            raise RequestError(f"an audio chunk of {len(chunk.audio)} bytes is not whole frames of {frame} bytes")
        audio, limit = stream.audio, self.service.max_transcribe_seconds
        if audio is not None:
            if audio.seconds + len(chunk.audio) / frame / chunk.rate > limit:
                stream.audio = None  # not kept: the rest of the stream is dropped
                raise RequestError(f"the audio to transcribe is longer than {limit:g} s, the limit "
                                   "(--max-audio-seconds; one voice command per transcribe request)", "too-long")
            if audio.resamples:
                await self.service.workers.submit("audio", audio.add, chunk.audio)
            else:  # a copy (and Home Assistant's 16 kHz needs none): not worth a thread hop
                audio.add(chunk.audio)
        elif stream.listener is not None and not stream.detected:
            await self._detect(stream, chunk, final=False)

    async def _detect(self, stream: _Stream, chunk: AudioChunk | None, final: bool) -> None:
        assert stream.listener is not None and stream.converter is not None and self.service.wake is not None
        listener, converter = stream.listener, stream.converter

        def work() -> list[float]:  # the conversion too: another rate is resampled
            pcm = converter.convert(chunk).audio if chunk is not None else b""
            return self.service.detect(listener, np.frombuffer(pcm, "<i2").astype(np.float32) / 32768.0, final)

        hits = await self.service.workers.submit("wake", work)
        if hits:
            stream.detected = True
            log.info("wyoming: wake word %s at %.2f s", self.service.wake.shown, hits[0])
            await self.write_event(Detection(name=self.service.wake.shown, timestamp=int(hits[0] * 1000)).event())

    async def _finish(self, stream: _Stream) -> None:
        if stream.purpose == "detect":
            if stream.listener is not None and not stream.detected:
                await self._detect(stream, None, final=True)
            if not stream.detected:
                await self.write_event(NotDetected().event())
            return
        audio, workers = stream.audio, self.service.workers
        if audio is None:
            x = np.zeros(0, np.float32)
        else:  # the resampler's tail is FFT work; without one, a copy
            x = await workers.submit("audio", audio.samples) if audio.resamples else audio.samples()
        stream.audio = None
        text = await workers.submit("asr", self.service.transcribe, x) if len(x) else ""
        log.info("wyoming: transcript of %.2f s: %r", len(x) / SAMPLE_RATE, text)
        await self.write_event(Transcript(text=text, language=stream.language).event())

    def _check_voice(self, voice: SynthesizeVoice | None) -> Served:
        tts = self.service.tts
        if tts is None:
            raise RequestError("this server does not synthesize speech (started without text-to-speech)", "not-served")
        if voice is not None and voice.name not in (None, tts.shown):
            raise RequestError(f"voice {voice.name!r} is not served (served: {tts.shown})", "not-served")
        return tts

    def _check_text(self, text: Any, event: str, before: int = 0) -> str:
        if not isinstance(text, str):
            raise RequestError(f"{event} event: its text is not a string")
        if before + len(text) > self.service.max_synthesize_chars:
            raise RequestError(f"the text to synthesize is {before + len(text)} characters; at most "
                               f"{self.service.max_synthesize_chars} per request", "too-long")
        return text

    async def _synthesize(self, request: Synthesize) -> None:
        if self._compat_synthesize:  # a streaming client's copy of the text it streamed: already spoken
            self._compat_synthesize = False
            return
        self._check_voice(request.voice)
        text = self._check_text(request.text, "synthesize").strip()
        out = _AudioOut()
        try:
            await self._speak(text, out)
        except BaseException:
            if out.rate is not None:  # the audio stream that started is closed before the error that follows
                await self._end_audio(out)
            raise
        await self._end_audio(out)

    async def _synthesize_start(self, request: SynthesizeStart) -> None:
        self._check_voice(request.voice)
        self._synth = _AudioOut(cutter=SentenceCutter())
        self._compat_synthesize = True  # a streaming client also sends the whole text in one synthesize event

    async def _synthesize_chunk(self, request: SynthesizeChunk) -> None:
        out = self._synth
        if out is None:
            raise RequestError("synthesize-chunk without synthesize-start")
        if out.refused:  # refused once: the rest of the text is dropped until synthesize-stop
            return
        try:
            text = self._check_text(request.text, "synthesize-chunk", out.chars)
            out.chars += len(text)
            assert out.cutter is not None
            for sentence in out.cutter.feed(text):
                await self._speak(sentence, out)
        except BaseException:
            out.refused = True
            raise

    async def _synthesize_stop(self) -> None:
        out, self._synth = self._synth, None
        if out is None:
            raise RequestError("synthesize-stop without synthesize-start")
        try:
            assert out.cutter is not None
            for sentence in ([] if out.refused else out.cutter.flush()):
                await self._speak(sentence, out)
        finally:  # the client's streams end as the protocol says, after an error too (reported when it happened)
            await self._end_audio(out)
            await self.write_event(SynthesizeStopped().event())

    async def _speak(self, text: str, out: _AudioOut) -> None:
        """Speech for ``text`` into ``out``'s audio stream, written as the voice makes it: the synthesis runs in a
        worker thread and hands its pieces to this loop; audio-start goes out with the first piece (the voice's rate)."""
        if not text:
            return
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        stop = threading.Event()
        done = object()

        def work() -> None:
            try:
                for piece in self.service.synthesize(text, stop):
                    loop.call_soon_threadsafe(queue.put_nowait, piece)
                loop.call_soon_threadsafe(queue.put_nowait, done)
            except BaseException as exc:  # handed to the loop, which reports it
                loop.call_soon_threadsafe(queue.put_nowait, exc)

        worker = self.service.workers.submit("tts", work)
        try:
            while (item := await queue.get()) is not done:
                if isinstance(item, BaseException):
                    raise item
                samples, rate = item
                if out.rate is None:
                    out.rate = rate
                    await self.write_event(AudioStart(rate=rate, width=2, channels=1, timestamp=0).event())
                elif rate != out.rate:
                    samples = resample(samples, rate, out.rate)  # one stream keeps one rate
                pcm = (np.clip(samples, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()
                for at in range(0, len(pcm), 2 * CHUNK_SAMPLES):
                    part = pcm[at : at + 2 * CHUNK_SAMPLES]
                    await self.write_event(AudioChunk(rate=out.rate, width=2, channels=1, audio=part,
                                                      timestamp=out.sent * 1000 // out.rate).event())
                    out.sent += len(part) // 2
        finally:
            stop.set()
            await worker

    async def _end_audio(self, out: _AudioOut) -> None:
        """audio-stop of ``out``'s stream (after an audio-start: an empty stream when nothing was said)."""
        with contextlib.suppress(ConnectionError, RuntimeError):
            if out.rate is None:  # nothing to say (only punctuation, or empty text): an empty stream at the usual rate
                out.rate = SAMPLE_RATE
                await self.write_event(AudioStart(rate=out.rate, width=2, channels=1, timestamp=0).event())
            await self.write_event(AudioStop(timestamp=out.sent * 1000 // out.rate).event())


@dataclass
class _AudioOut:
    """One synthesized audio stream: its rate once the voice has spoken, samples sent, and for a streamed request
    the sentence cutter and the characters received."""

    rate: int | None = None
    sent: int = 0
    cutter: SentenceCutter | None = None
    chars: int = 0
    refused: bool = False


# -- binding ----------------------------------------------------------------------------------------------------

def check_uri(uri: str, allow_lan: bool = False, warn: Callable[[str], None] | None = None) -> str:
    """``uri`` checked: ``tcp://HOST:PORT`` on a loopback address unless ``allow_lan`` (then ``warn`` is told that
    Wyoming has no authentication), ``unix://PATH`` or ``stdio://``. BadInput on one line otherwise."""
    try:
        parsed = urlparse(uri)
        port = parsed.port
    except ValueError as exc:
        raise BadInput(f"--uri {uri!r}: {exc} (use tcp://127.0.0.1:10300, unix://PATH or stdio://)") from None
    if parsed.scheme in ("unix", "stdio"):
        if parsed.scheme == "unix" and not parsed.path:
            raise BadInput(f"--uri {uri!r} names no socket path (use unix:///run/edgerun-wyoming.sock)")
        return uri
    if parsed.scheme != "tcp" or not parsed.hostname or port is None:
        raise BadInput(f"--uri {uri!r} is not tcp://HOST:PORT, unix://PATH or stdio:// (default {DEFAULT_URI})")
    host = parsed.hostname
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False  # a host name: where it points is not known here
    if not loopback:
        if not allow_lan:
            raise BadInput(f"--uri {uri!r} listens beyond this machine, and Wyoming has no authentication: anyone who "
                           "can reach the port can use the models; add --allow-lan to do so on a trusted network")
        if warn is not None:
            warn(f"warning: serving Wyoming on {host}:{port} with no authentication: anyone on the network can use it")
    return uri


async def serve(service: WyomingService, uri: str) -> None:
    """Serve until stopped (SIGTERM: the wyoming server's own graceful stop)."""
    server = AsyncServer.from_uri(uri)
    await server.run(service.handler)
