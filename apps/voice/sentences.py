"""Cut an LLM's streamed tokens into pieces to speak, as they arrive: the first sentence goes to TTS while the
rest is still being generated.

A sentence ends at ``. ! ?`` (or ``…`` and CJK forms), after any closing quotes or brackets, followed by
whitespace, or at a line break: "3.14" and "e.g.x" do not end one. An answer with no sentence end is still spoken in
bounded pieces: once the held text passes ``max_chars`` it is cut at its last clause mark (``, ; :`` then
whitespace), else its last whitespace, else hard at ``max_chars``. Markdown marks a chat model likes to emit
(``*``, ``#``, backticks, ``_`` emphasis, a list item's ``-``) are not spoken; a piece with no letter or digit is dropped.
"""

from __future__ import annotations

import re

MAX_CHARS = 100  # about 6 s of speech: the longest piece held back; runtime.speech.tts.MAX_PIECE_CHARS, so Piper takes it whole

_END = re.compile(r"[.!?…。！？]+[\"')\]»”’]*(?:\s+|\Z)|\n+")
_CLAUSE = re.compile(r"[,;:，；：]\s+")
_MARKUP = re.compile(r"[*#`]+|(?<!\w)_+|_+(?!\w)")
_BULLET = re.compile(r"^(?:[-•+]|\d+[.)])\s+")  # a list item's marker
_SPEAKABLE = re.compile(r"\w")


def speakable(text: str) -> str:
    """``text`` without markdown marks, its whitespace collapsed; "" when nothing in it can be said."""
    text = _BULLET.sub("", " ".join(_MARKUP.sub("", text).split()))
    return text if _SPEAKABLE.search(text) else ""


class SentenceCutter:
    """Feed streamed text with :meth:`feed`; each call returns the pieces completed so far; :meth:`flush` returns
    the rest at the end of the answer. One per answer; not shared between threads."""

    def __init__(self, max_chars: int = MAX_CHARS) -> None:
        if max_chars < 8:
            raise ValueError(f"max_chars {max_chars} is too small to hold a phrase (at least 8)")
        self.max_chars = max_chars
        self._pending = ""

    def feed(self, text: str) -> list[str]:
        self._pending += text
        out: list[str] = []
        while True:
            cut = self._cut()
            if cut is None:
                return [p for p in (speakable(s) for s in out) if p]
            out.append(self._pending[:cut])
            self._pending = self._pending[cut:]

    def flush(self) -> list[str]:
        """The held text as the last piece(s): still at most ``max_chars`` each."""
        out = []
        while len(self._pending) > self.max_chars:
            cut = self._forced_cut()
            out.append(self._pending[:cut])
            self._pending = self._pending[cut:]
        out.append(self._pending)
        self._pending = ""
        return [p for p in (speakable(s) for s in out) if p]

    def _cut(self) -> int | None:
        """Where the first complete piece of the held text ends (None: keep holding). A sentence end at the very
        end of the held text counts only with its whitespace: "3." may go on as "3.14"."""
        for m in _END.finditer(self._pending):
            if m.end() == len(self._pending) and not m.group()[-1].isspace():
                break  # "...3." at the end: wait for what follows ("3.14")
            if m.end() > self.max_chars:
                break
            return m.end()
        if len(self._pending) > self.max_chars:
            return self._forced_cut()
        return None

    def _forced_cut(self) -> int:
        head = self._pending[: self.max_chars + 1]
        clauses = [m.end() for m in _CLAUSE.finditer(head) if m.end() >= self.max_chars // 4]
        if clauses:
            return clauses[-1]
        space = max(head.rfind(" "), head.rfind("\n"), head.rfind("\t"))
        if space >= self.max_chars // 4:
            return space + 1
        return self.max_chars
