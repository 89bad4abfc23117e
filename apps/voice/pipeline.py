"""The voice pipeline: stages in threads, joined by bounded queues.

    input frames -> [listen: wake word, VAD] -> frames of one utterance -> [asr] -> transcript
        -> [think: LLM at URGENT priority, sentence cutter] -> sentences -> [speak: TTS] -> audio -> [output]

Every queue is bounded: a stage that falls behind blocks the one before it (the input drops its oldest frames
instead, see apps/voice/audio_io.py), never an unbounded backlog. Each turn is timed (apps/voice/timing.py).

Barge-in: speech that starts while an answer is being generated or played cancels that answer (the LLM request,
the sentences and audio queued for it, the audio playing) and is heard as the next turn, without the wake word.

Robustness: silence and noise end no turn (VAD); a turn whose transcript is empty is dropped with a log line; a
stage that fails on a turn (a model raising, a speaker that refuses a rate) is reported as one
:class:`~apps.voice.types.StageError` line and the assistant goes back to listening; only an input that is gone
for good (``fatal``) ends the session.

The models are given as small protocols (:class:`WakeWord`, :class:`Vad`, :class:`Recognizer`, :class:`Voice`,
and a callable that leases the LLM engine) so that apps/voice/models.py binds them to the runtime's resident models.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ContextManager, Protocol

import numpy as np

from apps.voice.conversation import Conversation
from apps.voice.sentences import SentenceCutter
from apps.voice.timing import SessionTiming, Timeline
from apps.voice.types import FRAME_SAMPLES, SAMPLE_RATE, AudioChunk, Mark, Stage, StageError, TurnEvent
from runtime.errors import Cancelled, EdgerunError, one_line

log = logging.getLogger(__name__)

PRE_ROLL_S = 0.3  # audio kept from before the VAD noticed speech: the first syllable
LISTEN_AFTER_WAKE_S = 6.0  # how long speech may take to start after the wake word
MAX_UTTERANCE_S = 20.0  # an utterance that does not end (a TV in the room) is cut here
LLM_EVENT_TIMEOUT_S = 60.0  # no token for this long: the LLM stage has failed


# -- the models, as the pipeline sees them --------------------------------------------------------------------
class WakeWord(Protocol):
    name: str

    def detect(self, frame: np.ndarray) -> float | None:
        """Feed one 16 kHz frame; the score when the wake word was just detected, else None."""

    def reset(self) -> None: ...


class Vad(Protocol):  # runtime.speech.vad.SpeechSegmenter
    def feed(self, samples: np.ndarray) -> list[Any]:
        """Feed 16 kHz audio; the events it completed, each with ``kind`` "start" or "end" (after a hangover)."""

    def reset(self) -> None: ...


class Transcriber(Protocol):  # runtime.speech.asr.StreamingTranscriber
    def feed(self, samples: np.ndarray) -> str | None:
        """More 16 kHz audio of the utterance; a partial transcript when one was decoded, else None."""

    def finish(self) -> Any:
        """The final transcript of the utterance: a str, or an object with ``text`` (runtime.speech.asr.Transcript)."""


class Recognizer(Protocol):
    def stream(self) -> Transcriber: ...


class Voice(Protocol):  # runtime.speech.tts.PiperTTS / EspeakTTS
    def speak(self, text: str) -> Iterator[Any]:
        """Chunks with ``samples`` (float32 mono -1..1) and ``rate``, as they are made."""


class Sink(Protocol):
    def write(self, chunk: AudioChunk) -> None: ...

    def stop(self) -> None: ...

    def close(self) -> None: ...


EngineLease = Callable[[], ContextManager[Any]]  # `with lease() as engine:` a runtime.serving.engine.Engine


@dataclass
class Models:
    """What the pipeline runs. ``wake`` None: every utterance is a turn (no wake word)."""

    vad: Vad
    asr: Recognizer
    llm: EngineLease
    tts: Voice
    wake: WakeWord | None = None


@dataclass
class Options:
    barge_in: bool = True
    # A file read faster than real time: the next frame waits until the turns heard so far are answered (one
    # question at a time, no barge-in by a question that would only have been asked later).
    hold_input: bool = False
    listen_after_wake_s: float = LISTEN_AFTER_WAKE_S
    max_utterance_s: float = MAX_UTTERANCE_S
    queue_frames: int = int(MAX_UTTERANCE_S * SAMPLE_RATE / FRAME_SAMPLES) + 16  # a whole utterance: listening never waits for ASR
    queue_sentences: int = 4
    queue_transcripts: int = 2
    queue_audio: int = 16


@dataclass
class TurnResult:
    turn: int
    transcript: str = ""
    answer: str = ""
    spoken: list[str] = field(default_factory=list)
    interrupted: bool = False
    error: str | None = None
    latencies_ms: dict[str, float] = field(default_factory=dict)
    truncations: list[Any] = field(default_factory=list)


_END = object()  # end of input: each stage passes it on and stops


@dataclass
class _Turn:
    turn: int
    timeline: Timeline
    result: TurnResult
    cancelled: threading.Event = field(default_factory=threading.Event)
    sent: list[str] = field(default_factory=list)  # sentences handed to TTS
    played: list[str] = field(default_factory=list)  # sentences whose audio started playing
    memory: dict[str, str] | None = None  # its answer in the conversation memory (revised on barge-in)


class Pipeline:
    """``run(frames)`` until the input ends (a file) or :meth:`stop`; returns every turn's result."""

    def __init__(self, models: Models, sink: Sink, *, conversation: Conversation | None = None,
                 options: Options | None = None, timing: SessionTiming | None = None,
                 on_event: Callable[[TurnEvent], None] | None = None,
                 on_error: Callable[[StageError], None] | None = None) -> None:
        self.models, self.sink = models, sink
        self.conversation = conversation or Conversation()
        self.options = options or Options()
        self.timing = timing or SessionTiming(on_event)
        self.on_error = on_error
        self.results: list[TurnResult] = []
        self.errors: list[StageError] = []
        self._utterances: queue.Queue[Any] = queue.Queue(self.options.queue_frames)
        self._transcripts: queue.Queue[Any] = queue.Queue(self.options.queue_transcripts)
        self._sentences: queue.Queue[Any] = queue.Queue(self.options.queue_sentences)
        self._audio: queue.Queue[Any] = queue.Queue(self.options.queue_audio)
        self._lock = threading.Lock()
        self._active: _Turn | None = None  # the turn being answered (thought, spoken or played)
        self._reply: Any = None  # its LLM reply, while it streams
        self._turns = 0
        self._stopping = threading.Event()
        self._failing: set[Stage] = set()  # wake/VAD stages failing now (reported once per run of failures)
        self._open: set[int] = set()  # turns heard to their end of speech and not finished yet
        self._settled = threading.Condition(self._lock)

    # -- running ----------------------------------------------------------------------------------------------
    def run(self, frames: Iterator[AudioChunk]) -> list[TurnResult]:
        """Listen on ``frames`` (in this thread) until they end or :meth:`stop`; the other stages run in their own
        threads and finish the turn in progress. A fatal StageError (the input gone) is raised after that."""
        stages = ((self._asr_loop, Stage.ASR, self._utterances, self._transcripts),
                  (self._think_loop, Stage.LLM, self._transcripts, self._sentences),
                  (self._speak_loop, Stage.TTS, self._sentences, self._audio),
                  (self._output_loop, Stage.OUTPUT, self._audio, None))
        workers = [threading.Thread(target=self._guard(*s), name=f"voice-{s[1].value}", daemon=True) for s in stages]
        for w in workers:
            w.start()
        fatal: StageError | None = None
        try:
            self._listen(frames)
        except StageError as exc:
            fatal = exc
            self._report(exc)
        except Exception as exc:  # the input's own failure (a device error, a reader bug): one line, not a traceback
            fatal = StageError(Stage.INPUT, _describe(exc), fatal=True)
            self._report(fatal)
        except BaseException:  # Ctrl-C: the answer in progress stops now
            self._barge_in(time.monotonic(), reason="stopped")
            raise
        finally:
            self._utterances.put(_END)
            for w in workers:
                w.join()
            self.sink.close()
        if fatal is not None and fatal.fatal:
            raise fatal
        return self.results

    def stop(self) -> None:
        """End the session: the listener stops at its next frame; the turn in progress finishes."""
        self._stopping.set()
        with self._settled:
            self._settled.notify_all()

    def _guard(self, loop: Callable[[], None], stage: Stage, inbox: queue.Queue[Any],
               outbox: queue.Queue[Any] | None) -> Callable[[], None]:
        """A stage's thread: its loop, and if the loop itself breaks (a bug, not a model failing on a turn: those
        are reported by the loop), the error reported, the session stopped, and the inbox drained to its END so that
        no stage before it blocks for ever; the END is passed on."""

        def run() -> None:
            try:
                loop()
                return
            except BaseException as exc:
                self._report(StageError(stage, f"{type(exc).__name__}: {one_line(exc)}", fatal=True))
                log.error("voice %s stage stopped", stage.value, exc_info=True)
                self.stop()
            while inbox.get() is not _END:
                pass
            if outbox is not None:
                outbox.put(_END)

        return run

    def _report(self, err: StageError) -> None:
        self.errors.append(err)
        log.warning("%s%s", f"turn {err.turn}: " if err.turn is not None else "", err)
        if self.on_error is not None:
            self.on_error(err)

    # -- listen: wake word and VAD on every frame (the input's thread) ---------------------------------------
    def _listen(self, frames: Iterator[AudioChunk]) -> None:
        opts, wake, vad = self.options, self.models.wake, self.models.vad
        pre_roll: collections.deque[np.ndarray] = collections.deque(maxlen=max(1, int(PRE_ROLL_S * SAMPLE_RATE / FRAME_SAMPLES)))
        awake_until = 0.0  # after the wake word: speech must start before then
        pending: Timeline | None = None  # the turn opened by the wake word, waiting for speech
        speech: Timeline | None = None  # the utterance being heard
        heard = 0
        vad_frames = 0  # frames the VAD has seen since its last reset (its events count frames)
        frames = iter(frames)
        while not self._stopping.is_set():
            try:
                chunk = next(frames)
            except StopIteration:
                break
            except Exception:
                if speech is not None:  # the input failed mid-utterance: what was heard is still a turn
                    speech.mark(Mark.SPEECH_END, time.monotonic(), seconds=round(heard * FRAME_SAMPLES / SAMPLE_RATE, 2))
                    self._end_utterance(speech)
                raise
            frame = self._checked(chunk)
            if opts.hold_input and speech is None:
                with self._settled:
                    self._settled.wait_for(lambda: not self._open or self._stopping.is_set())
            answering = self._answering()
            if speech is None and answering and not opts.barge_in:
                continue  # half duplex: the assistant does not listen while it answers (it would hear itself)
            if speech is None and pending is None and wake is not None and not answering:
                score = self._frame_stage(Stage.WAKE, wake.detect, frame)
                if score is not None:
                    pending = self._open_turn()
                    pending.mark(Mark.WAKE, chunk.t, wake_word=wake.name, score=round(float(score), 3))
                    awake_until = chunk.t + opts.listen_after_wake_s
                    vad.reset()
                    vad_frames = 0
                    pre_roll.clear()
                    continue
            events = self._frame_stage(Stage.VAD, vad.feed, frame) or ()
            vad_frames += len(frame) // FRAME_SAMPLES
            event = events[-1].kind if events else None
            if speech is None:
                pre_roll.append(frame)
                barge = event == "start" and answering
                if event == "start" and (wake is None or pending is not None or barge):
                    if barge:
                        self._barge_in(chunk.t)
                    speech, pending = pending or self._open_turn(), None
                    speech.mark(Mark.SPEECH_START, chunk.t)
                    self._utterances.put(("start", speech))
                    for f in pre_roll:
                        self._utterances.put(f)
                    heard = len(pre_roll)
                    pre_roll.clear()
                elif pending is not None and chunk.t > awake_until:
                    log.info("turn %d: no speech within %.0f s of the wake word", pending.turn, opts.listen_after_wake_s)
                    pending.mark(Mark.DONE, chunk.t, reason="no speech after the wake word")
                    self._finish(_Turn(pending.turn, pending, TurnResult(pending.turn, error="no speech")))
                    pending = None
                    wake.reset()  # type: ignore[union-attr]  # pending is only set with a wake word
                continue
            self._utterances.put(frame)
            heard += 1
            too_long = heard * FRAME_SAMPLES / SAMPLE_RATE >= opts.max_utterance_s
            if event == "end" or too_long:
                # The end of speech is the VAD's first silent frame, not the moment its hangover ran out: the
                # latencies count from when the user stopped talking (the hangover is part of them).
                ended_at = chunk.t
                frame_no = getattr(events[-1], "frame", None) if event == "end" else None
                if isinstance(frame_no, int) and 0 <= frame_no <= vad_frames:
                    ended_at = chunk.t - (vad_frames - frame_no) * FRAME_SAMPLES / SAMPLE_RATE
                if too_long:
                    log.warning("turn %d: utterance cut at %.0f s", speech.turn, opts.max_utterance_s)
                    vad.reset()
                    vad_frames = 0
                speech.mark(Mark.SPEECH_END, ended_at, seconds=round(heard * FRAME_SAMPLES / SAMPLE_RATE, 2),
                            vad_decided_ms=round((chunk.t - ended_at) * 1000, 1))
                self._end_utterance(speech)
                speech = None
                if wake is not None:
                    wake.reset()
        if speech is not None:  # the input ended mid-utterance: what was heard is the turn
            speech.mark(Mark.SPEECH_END, time.monotonic(), seconds=round(heard * FRAME_SAMPLES / SAMPLE_RATE, 2))
            self._end_utterance(speech)

    def _end_utterance(self, speech: Timeline) -> None:
        with self._lock:
            self._open.add(speech.turn)
        self._utterances.put(("end", speech))

    @staticmethod
    def _checked(chunk: AudioChunk) -> np.ndarray:
        if chunk.rate != SAMPLE_RATE or chunk.samples.ndim != 1:
            raise StageError(Stage.INPUT, f"input frames must be mono {SAMPLE_RATE} Hz, got shape {chunk.samples.shape} at "
                             f"{chunk.rate} Hz", fatal=True)
        frame = np.nan_to_num(np.asarray(chunk.samples, np.float32), nan=0.0, posinf=1.0, neginf=-1.0)
        return np.clip(frame, -1.0, 1.0)

    def _frame_stage(self, stage: Stage, fn: Callable[[np.ndarray], Any], frame: np.ndarray) -> Any:
        """Wake word and VAD on one frame: a failure skips the frame, reported once per run of failures."""
        try:
            out = fn(frame)
        except Exception as exc:
            if stage not in self._failing:
                self._failing.add(stage)
                self._report(StageError(stage, one_line(exc) if isinstance(exc, EdgerunError)
                                        else f"{type(exc).__name__}: {one_line(exc)}"))
            return None
        self._failing.discard(stage)
        return out

    def _open_turn(self) -> Timeline:
        self._turns += 1
        return self.timing.timeline(self._turns)

    def _answering(self) -> bool:
        with self._lock:
            return self._active is not None and not self._active.cancelled.is_set()

    def _barge_in(self, t: float, reason: str = "barge-in") -> None:
        with self._lock:
            turn, reply = self._active, self._reply
        if turn is None or turn.cancelled.is_set():
            return
        log.info("turn %d: %s, the answer is stopped", turn.turn, reason)
        turn.cancelled.set()
        turn.result.interrupted = True
        turn.timeline.mark(Mark.DONE, t, reason=reason, played=len(turn.played))
        if reply is not None:
            reply.cancel()
        self.sink.stop()
        if turn.memory is not None:  # the answer was remembered whole: the user heard only this much
            turn.memory["content"] = " ".join(turn.played) or "..."

    # -- asr: one transcriber per utterance, fed as the audio arrives -----------------------------------------
    def _asr_loop(self) -> None:
        stream: Any = None
        failed: str | None = None
        timeline: Timeline | None = None
        while True:
            item = self._utterances.get()
            if item is _END:
                self._transcripts.put(_END)
                return
            if isinstance(item, tuple):
                kind, timeline = item
                if kind == "start":
                    failed, stream = None, None
                    try:
                        stream = self.models.asr.stream()
                    except Exception as exc:
                        failed = _describe(exc)
                else:
                    self._transcribed(timeline, stream, failed)
                    stream = None
                continue
            if stream is None or failed is not None:
                continue
            try:
                partial = stream.feed(item)
            except Exception as exc:
                failed = _describe(exc)
                continue
            if partial and timeline is not None:
                log.debug("turn %d: partial transcript %r", timeline.turn, partial)

    def _transcribed(self, timeline: Timeline, stream: Any, failed: str | None) -> None:
        turn = _Turn(timeline.turn, timeline, TurnResult(timeline.turn))
        if failed is None:
            try:
                final = stream.finish()
                turn.result.transcript = " ".join(str(getattr(final, "text", final)).split())
            except Exception as exc:
                failed = _describe(exc)
        if failed is not None:
            return self._fail(turn, Stage.ASR, failed)
        timeline.mark(Mark.TRANSCRIPT, time.monotonic(), text=turn.result.transcript)
        if not any(c.isalnum() for c in turn.result.transcript):
            log.info("turn %d: empty transcript, back to listening", timeline.turn)
            turn.result.error = "empty transcript"
            timeline.mark(Mark.DONE, time.monotonic(), reason="empty transcript")
            return self._finish(turn)
        self._transcripts.put(turn)

    # -- think: the LLM's answer, cut into sentences as it streams -----------------------------------------------
    def _think_loop(self) -> None:
        while True:
            turn = self._transcripts.get()
            if turn is _END:
                self._sentences.put(_END)
                return
            self._think(turn)

    def _think(self, turn: _Turn) -> None:
        text, timeline = turn.result.transcript, turn.timeline
        with self._lock:
            previous = self._active
        if previous is not None and not previous.cancelled.is_set():
            self._barge_in(time.monotonic())  # a newer question replaces an answer still playing
        with self._lock:
            self._active = turn
        cutter, reply, failed = SentenceCutter(), None, None
        try:
            with self.models.llm() as engine:
                reply = self.conversation.ask(engine, text)
                with self._lock:
                    self._reply = reply
                if turn.cancelled.is_set():
                    reply.cancel()
                for piece in reply.pieces(LLM_EVENT_TIMEOUT_S):
                    timeline.mark(Mark.FIRST_TOKEN, time.monotonic())
                    for sentence in cutter.feed(piece):
                        self._send_sentence(turn, sentence)
                for sentence in cutter.flush():
                    self._send_sentence(turn, sentence)
        except Cancelled:
            pass  # barge-in: what was said so far is remembered below
        except Exception as exc:  # the lease (DoesNotFit), the engine, a stalled stream (TimeoutError)
            failed = _describe(exc)
        finally:
            with self._lock:
                self._reply = None
        if reply is not None:
            turn.result.answer = reply.text
            turn.result.truncations = list(reply.truncations)
            for t in reply.truncations:
                log.warning("turn %d: context shift (%s): %d tokens, %d messages left the context; the system prompt "
                            "is kept", turn.turn, t.kind, t.tokens_dropped, t.messages_dropped)
            turn.memory = self.conversation.remember(text, reply.text)
            if turn.cancelled.is_set():  # barge-in: remembered as far as it was heard
                turn.memory["content"] = " ".join(turn.played) or "..."
        if failed is not None:
            return self._fail(turn, Stage.LLM, failed, active=True)
        self._sentences.put(("end", turn))

    def _send_sentence(self, turn: _Turn, sentence: str) -> None:
        if turn.cancelled.is_set():
            return
        turn.timeline.mark(Mark.FIRST_SENTENCE, time.monotonic(), text=sentence)
        turn.sent.append(sentence)
        self._sentences.put((turn, sentence))

    # -- speak: TTS per sentence --------------------------------------------------------------------------------
    def _speak_loop(self) -> None:
        while True:
            item = self._sentences.get()
            if item is _END:
                self._audio.put(_END)
                return
            if item[0] == "end":
                self._audio.put(item)
                continue
            turn, sentence = item
            if turn.cancelled.is_set():
                continue
            try:
                for made in self.models.tts.speak(sentence):
                    if turn.cancelled.is_set():
                        break
                    chunk = AudioChunk(np.asarray(made.samples, np.float32), int(made.rate), time.monotonic())
                    self._audio.put((turn, chunk, sentence))
            except Exception as exc:
                self._report(StageError(Stage.TTS, f"could not speak {sentence[:40]!r}: {_describe(exc)}", turn=turn.turn))
                turn.result.error = turn.result.error or f"tts: {_describe(exc)}"
                continue
            turn.result.spoken.append(sentence)

    # -- output: the sink (file or speaker) ---------------------------------------------------------------------
    def _output_loop(self) -> None:
        broken: str | None = None  # the sink failed on this turn: the rest of its audio is dropped
        while True:
            item = self._audio.get()
            if item is _END:
                return
            if item[0] == "end":
                turn = item[1]
                if not turn.cancelled.is_set():
                    shifts = [vars(t) for t in turn.result.truncations]
                    turn.timeline.mark(Mark.DONE, time.monotonic(), spoken=len(turn.result.spoken),
                                       **({"context_shifts": shifts} if shifts else {}))
                self._finish(turn)
                broken = None
                continue
            turn, chunk, sentence = item
            if turn.cancelled.is_set() or broken is not None:
                continue
            turn.timeline.mark(Mark.FIRST_AUDIO, time.monotonic())
            if not turn.played or turn.played[-1] is not sentence:
                turn.played.append(sentence)
            try:
                self.sink.write(chunk)
            except Exception as exc:
                broken = _describe(exc)
                self._report(StageError(Stage.OUTPUT, broken, turn=turn.turn))
                turn.result.error = turn.result.error or f"output: {broken}"

    # -- turn ends ------------------------------------------------------------------------------------------------
    def _fail(self, turn: _Turn, stage: Stage, message: str, active: bool = False) -> None:
        """A stage failed on ``turn``: reported; the turn ends (after what it already queued, when ``active``)."""
        self._report(StageError(stage, message, turn=turn.turn))
        turn.result.error = f"{stage.value}: {message}"
        if active:
            self._sentences.put(("end", turn))
            return
        turn.timeline.mark(Mark.DONE, time.monotonic(), error=turn.result.error)
        self._finish(turn)

    def _finish(self, turn: _Turn) -> None:
        turn.result.latencies_ms = self.timing.finish(turn.timeline)
        with self._lock:
            if self._active is turn:
                self._active = None
            self.results.append(turn.result)
            self._open.discard(turn.turn)
            self._settled.notify_all()


def _describe(exc: BaseException) -> str:
    """One line for a model's failure: our own errors by message, others with their type."""
    return one_line(exc) if isinstance(exc, EdgerunError) else f"{type(exc).__name__}: {one_line(exc)}"
