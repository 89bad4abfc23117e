"""Content safety: a pluggable chain of filters over request input and streamed output.

A filter answers one question, ``check(text, stage) -> Verdict | None``: ``None`` lets the text pass, a Verdict
blocks it. :class:`FilterChain` runs its filters in order on the input (:meth:`FilterChain.check_input`) and, as
the output streams, on each completed sentence (:meth:`FilterChain.stream_checker`). The stream checker holds back
the unfinished sentence, so text reaches the client only after the sentence it belongs to has passed: a blocked
word split across streamed pieces is caught before any of it is sent.

Built-ins: :class:`SizeLimit` (input by default), :class:`Blocklist` (whole words or phrases, case-insensitive),
:class:`RegexFilter` (bounded patterns) and :class:`ClassifierFilter` (any scorer ``text -> {label: score}``;
:func:`bundle_scorer` turns an edgerun classifier bundle plus a text encoder into one). A block raises
:class:`Blocked`, a BadInput (exit 2 / HTTP 400) carrying ``.reason`` (the filter's short name, fit for a metric
label) and ``.stage``. No asyncio and no HTTP here: the kiosk and the voice assistant use the same chain.
"""

from __future__ import annotations

import logging
import re
import threading
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from runtime.errors import BadInput, one_line

log = logging.getLogger(__name__)

Stage = Literal["input", "output"]
STAGES: tuple[Stage, ...] = ("input", "output")

MAX_PATTERNS = 64  # regex patterns per RegexFilter
MAX_PATTERN_CHARS = 256  # characters per pattern: Python's re has no time limit, so patterns stay small
MAX_WORDS = 10_000  # words or phrases per Blocklist
MAX_WORD_CHARS = 100
MAX_SENTENCE_CHARS = 2_000  # a "sentence" with no end this long is checked at its last whitespace
CARRY_CHARS = 2 * MAX_WORD_CHARS  # of such a forced cut, checked again with the text after it

# A sentence ends at . ! ? (or their CJK forms) followed by whitespace, or at a line break. "3.14" and "e.g.x"
# do not end one; the end of the stream always does.
_SENTENCE_END = re.compile(r"(?:[.!?…。！？]+[\"')\]»”’]*\s+|\n+)")
# Text is released to the client at either; filters see whole sentences, which end only at the punctuation: what a
# line break (or a forced cut) released is checked again together with what follows it, since a phrase matches
# across any whitespace.
_PUNCT_END = re.compile(r"[.!?…。！？]+[\"')\]»”’]*\s+")
_ENDS_AT_PUNCT = re.compile(_PUNCT_END.pattern + r"\Z")
# Characters that render as nothing are dropped before matching, so "b\u200bad" cannot slip past a blocklist entry
# "bad": every format character (category Cf: zero-width space and joiners, soft hyphen, bidi controls, invisible
# operators, tags...) and the other default-ignorable ones (combining grapheme joiner, Hangul fillers, variation
# selectors). Cf characters lie in planes 0, 1 and 14 only, so only those are scanned.
_INVISIBLE = {cp: None for cp in (*range(0x20000), *range(0xE0000, 0xE1000))
              if unicodedata.category(chr(cp)) == "Cf"}
_INVISIBLE.update({cp: None for cp in (0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x180B, 0x180C, 0x180D, 0x180F,
                                       0x3164, 0xFFA0, *range(0xFE00, 0xFE10), *range(0xE0100, 0xE01F0))})


def normalize(text: str) -> str:
    """The form filters match on: NFKC (fullwidth and ligature letters fold to plain ones), invisible characters
    removed."""
    return unicodedata.normalize("NFKC", text).translate(_INVISIBLE)


@dataclass(frozen=True)
class Verdict:
    """Why a filter blocked a text. ``reason``: a short fixed name (``size``, ``blocklist``, ``regex``,
    ``classifier``...) used as a metric label; ``detail``: one line for the client, which never repeats blocked
    output text."""

    reason: str
    detail: str


class Blocked(BadInput):
    """A filter blocked the request's input or its output (HTTP 400, exit 2)."""

    def __init__(self, verdict: Verdict, stage: Stage) -> None:
        super().__init__(f"{stage} blocked by the {verdict.reason} filter: {verdict.detail}")
        self.reason, self.stage, self.detail = verdict.reason, stage, verdict.detail


class Filter(Protocol):
    """``check`` returns None to let ``text`` pass at ``stage``, a Verdict to block it. It must be thread-safe
    (one chain serves every request). An optional ``stages`` attribute (a set of "input"/"output") says which
    stages it checks; without one it is asked about both."""

    def check(self, text: str, stage: Stage) -> Verdict | None: ...


def _stages(stages: Iterable[str]) -> frozenset[str]:
    out = frozenset(stages)
    bad = sorted(out - set(STAGES))
    if bad or not out:
        raise BadInput(f"filter stages {sorted(out)!r} are not valid; use one or both of {list(STAGES)}")
    return out


class SizeLimit:
    """Blocks text longer than ``max_chars`` characters. Input only by default: the output's size is bounded by
    max_tokens, and the stream checker shows a filter one sentence at a time."""

    def __init__(self, max_chars: int, *, stages: Iterable[str] = ("input",)) -> None:
        if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 1:
            raise BadInput(f"size limit {max_chars!r} is not valid; give a whole number of characters >= 1")
        self.max_chars, self.stages = max_chars, _stages(stages)

    def check(self, text: str, stage: Stage) -> Verdict | None:
        if stage in self.stages and len(text) > self.max_chars:
            return Verdict("size", f"{len(text)} characters, the limit is {self.max_chars}")
        return None


class Blocklist:
    """Blocks text containing any of ``words`` as a whole word or phrase, case-insensitively: "ass" blocks
    "Ass!" but not "class" or "assistant". A phrase matches across any run of whitespace."""

    def __init__(self, words: Iterable[str], *, stages: Iterable[str] = STAGES) -> None:
        cleaned = []
        for i, word in enumerate(words):
            if not isinstance(word, str) or not normalize(word).split():
                raise BadInput(f"blocklist entry {i} ({word!r}) is empty or not text; give words or phrases")
            if len(word) > MAX_WORD_CHARS:
                raise BadInput(f"blocklist entry {i} is {len(word)} characters long; the limit is {MAX_WORD_CHARS}")
            cleaned.append(normalize(word).split())
        if len(cleaned) > MAX_WORDS:
            raise BadInput(f"the blocklist has {len(cleaned)} entries; the limit is {MAX_WORDS}")
        self.words = [" ".join(parts) for parts in cleaned]
        self.stages = _stages(stages)
        # Matched on case-folded text ("STRASSE" is "straße"); longest first, so a phrase wins over a word it
        # starts with; \w boundaries on both ends (Unicode-aware).
        alternatives = sorted((r"\s+".join(re.escape(p.casefold()) for p in parts) for parts in cleaned), key=len, reverse=True)
        self._re = re.compile(r"(?<!\w)(?:" + "|".join(alternatives) + r")(?!\w)") if alternatives else None

    def check(self, text: str, stage: Stage) -> Verdict | None:
        if stage not in self.stages or self._re is None:
            return None
        found = self._re.search(normalize(text).casefold())
        if found is None:
            return None
        # Input is the client's own text, so naming the word helps them; output text is never echoed back.
        detail = f"the blocked word {found.group(0)!r}" if stage == "input" else "a blocked word in the generated text"
        return Verdict("blocklist", detail)


class RegexFilter:
    """Blocks text matching any of ``patterns`` (Python ``re`` syntax, searched case-insensitively unless
    ``ignore_case=False``). At most MAX_PATTERNS patterns of at most MAX_PATTERN_CHARS characters each."""

    def __init__(self, patterns: Sequence[str], *, ignore_case: bool = True, stages: Iterable[str] = STAGES) -> None:
        if isinstance(patterns, str):
            raise BadInput("regex filter patterns must be a list of strings, not one string")
        patterns = list(patterns)
        if len(patterns) > MAX_PATTERNS:
            raise BadInput(f"the regex filter has {len(patterns)} patterns; the limit is {MAX_PATTERNS}")
        self.compiled: list[re.Pattern[str]] = []
        for i, pattern in enumerate(patterns):
            if not isinstance(pattern, str) or not pattern:
                raise BadInput(f"regex filter pattern {i} ({pattern!r}) is empty or not text")
            if len(pattern) > MAX_PATTERN_CHARS:
                raise BadInput(f"regex filter pattern {i} is {len(pattern)} characters long; the limit is {MAX_PATTERN_CHARS}")
            try:
                self.compiled.append(re.compile(pattern, re.IGNORECASE if ignore_case else 0))
            except (re.error, RecursionError, OverflowError) as exc:
                shown = repr(pattern) if len(pattern) <= 60 else repr(pattern[:57]) + "..."
                raise BadInput(f"regex filter pattern {i} ({shown}) does not compile: {one_line(exc, 160)}; "
                               "give Python re syntax") from None
        self.patterns = patterns
        self.stages = _stages(stages)

    def check(self, text: str, stage: Stage) -> Verdict | None:
        if stage not in self.stages:
            return None
        text = normalize(text)
        for i, compiled in enumerate(self.compiled):
            if compiled.search(text):
                return Verdict("regex", f"pattern {i} matched")
        return None


TextScorer = Callable[[str], Mapping[str, float]]


class ClassifierFilter:
    """Blocks text that ``classifier`` scores at or above ``threshold`` for any of ``labels``.

    ``classifier`` is any callable ``text -> {label: score}``; :func:`bundle_scorer` makes one from an edgerun
    classifier bundle (runtime.classify.classifier.Classifier or AudioClassifier) and a text encoder. When the scorer has
    a ``labels`` attribute, labels it does not know are refused here rather than never matching."""

    def __init__(self, classifier: TextScorer, labels: Iterable[str], threshold: float = 0.5, *,
                 stages: Iterable[str] = STAGES) -> None:
        if not callable(classifier):
            raise BadInput(f"a classifier filter needs a callable text -> {{label: score}}, not {type(classifier).__name__} "
                           "(wrap a classifier bundle with runtime.serving.safety.bundle_scorer)")
        self.labels = list(labels)
        if not self.labels:
            raise BadInput("a classifier filter needs at least one label to block")
        known = getattr(classifier, "labels", None)
        if known is not None:
            unknown = [label for label in self.labels if label not in known]
            if unknown:
                raise BadInput(f"classifier filter labels {unknown} are not the classifier's; valid: {list(known)}")
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 < threshold <= 1.0:
            raise BadInput(f"classifier filter threshold {threshold!r} is not valid; give a number in (0, 1]")
        self.classifier, self.threshold, self.stages = classifier, float(threshold), _stages(stages)

    def check(self, text: str, stage: Stage) -> Verdict | None:
        if stage not in self.stages:
            return None
        scores = self.classifier(normalize(text))
        hits = [(label, float(scores.get(label, 0.0))) for label in self.labels]
        label, score = max(hits, key=lambda hit: hit[1])
        if score >= self.threshold:
            return Verdict("classifier", f"scored {score:.2f} for {label!r} (threshold {self.threshold:.2f})")
        return None


class _BundleScorer:
    def __init__(self, classifier: Any, encode: Callable[[str], Any]) -> None:
        self.classifier, self.encode, self.labels = classifier, encode, list(classifier.labels)
        self._lock = threading.Lock()  # one chain serves every request; a LiteRT interpreter is not re-entrant

    def __call__(self, text: str) -> dict[str, float]:
        x = self.encode(text)
        with self._lock:
            row = self.classifier.scores(x)[0]
        return {label: float(score) for label, score in zip(self.labels, row, strict=True)}


def bundle_scorer(classifier: Any, encode: Callable[[str], Any]) -> TextScorer:
    """A scorer over an edgerun classifier bundle: ``encode(text)`` gives a batch of one in the model's input layout
    (what ``classifier.scores`` takes), and the first row of scores is named by ``classifier.labels``. edgerun has
    no text classifier bundle yet; this is the seam one plugs into (its tokenizer becomes ``encode``)."""
    if not hasattr(classifier, "scores") or not hasattr(classifier, "labels"):
        raise BadInput(f"{type(classifier).__name__} is not an edgerun classifier (needs .scores(x) and .labels)")
    return _BundleScorer(classifier, encode)


class FilterChain:
    """Filters run in order; the first verdict blocks. An empty chain lets everything pass."""

    def __init__(self, filters: Iterable[Filter] = ()) -> None:
        self.filters = list(filters)
        for f in self.filters:
            if not callable(getattr(f, "check", None)):
                raise BadInput(f"{type(f).__name__} is not a filter (it has no check(text, stage) method)")
        # A filter without a ``stages`` attribute is taken to check both. With none for the output, streamed text
        # is not held back at all (the default chain, a size limit, costs streaming nothing).
        self.checks_output = any("output" in getattr(f, "stages", STAGES) for f in self.filters)

    def check(self, text: str, stage: Stage) -> Verdict | None:
        for f in self.filters:
            verdict = f.check(text, stage)
            if verdict is not None:
                return verdict
        return None

    def check_input(self, text: str) -> None:
        """Raises Blocked when any filter blocks ``text`` (a prompt, or the chat messages' text joined)."""
        verdict = self.check(text, "input")
        if verdict is not None:
            raise Blocked(verdict, "input")

    def stream_checker(self, *, max_sentence_chars: int = MAX_SENTENCE_CHARS) -> StreamChecker:
        """A checker for one streamed response (see StreamChecker)."""
        return StreamChecker(self, max_sentence_chars=max_sentence_chars)


class StreamChecker:
    """Checks streamed output one completed sentence at a time. One per response; not shared between threads.

    ``feed(piece)`` returns the text now safe to send (the sentences completed and passed so far), holding back
    the unfinished one (nothing is held back when no filter of the chain checks output); ``finish()`` checks and
    returns the rest. Both raise Blocked, after which the checker refuses more text (the response is over).
    Text is released at sentence ends and at line breaks; a sentence longer than ``max_sentence_chars`` is
    released in parts at whitespace. A part released without its sentence's end (at a line break or such a cut)
    is checked again, its last CARRY_CHARS characters, together with the part after it."""

    def __init__(self, chain: FilterChain, *, max_sentence_chars: int = MAX_SENTENCE_CHARS) -> None:
        self.chain, self.max_sentence_chars = chain, max_sentence_chars
        self._pending = ""
        self._carry = ""  # the end of a run-on sentence already checked, checked again with what follows it
        self.blocked: Blocked | None = None

    def feed(self, piece: str) -> str:
        if self.blocked is not None:
            raise self.blocked
        if not self.chain.checks_output:
            return piece
        self._pending += piece
        cut = 0
        for end in _SENTENCE_END.finditer(self._pending):
            cut = end.end()
        forced = cut == 0 and len(self._pending) > self.max_sentence_chars
        if forced:
            # No sentence end in sight: release up to the last whitespace, and keep the tail of what was released
            # to check again with what follows, so a word or phrase across the cut is still seen whole.
            cut = max(self._pending.rfind(" "), self._pending.rfind("\t")) + 1 or len(self._pending)
        if cut == 0:
            return ""
        ready, self._pending = self._pending[:cut], self._pending[cut:]
        return self._release(ready)

    def finish(self) -> str:
        if self.blocked is not None:
            raise self.blocked
        ready, self._pending = self._pending, ""
        return self._release(ready) if ready else ""

    def _release(self, text: str) -> str:
        sentences = _split_sentences(text)
        if sentences and self._carry:
            sentences[0] = self._carry + sentences[0]
        for sentence in sentences:
            verdict = self.chain.check(sentence, "output")
            if verdict is not None:
                self.blocked = Blocked(verdict, "output")
                self._pending = ""
                raise self.blocked
        if _ENDS_AT_PUNCT.search(text):
            self._carry = ""
        elif sentences:  # released at a line break or a forced cut: the sentence goes on in what follows
            self._carry = sentences[-1][-CARRY_CHARS:]
        return text


def _split_sentences(text: str) -> list[str]:
    out, start = [], 0
    for end in _PUNCT_END.finditer(text):
        out.append(text[start : end.end()])
        start = end.end()
    if start < len(text):
        out.append(text[start:])
    return [s for s in out if s.strip()]
