"""The sentence cutter: streamed LLM text -> pieces to speak, released as soon as each is complete."""

from __future__ import annotations

import re

import pytest

from apps.voice.sentences import SentenceCutter, speakable


def _stream(text: str, size: int = 3) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def test_first_sentence_released_before_the_answer_ends() -> None:
    answer = "Paris is the capital of France. It lies on the Seine. About two million people live there."
    cut = SentenceCutter()
    released_at: list[tuple[int, str]] = []
    pieces = _stream(answer)
    for i, piece in enumerate(pieces):
        released_at += [(i, s) for s in cut.feed(piece)]
    released_at += [(len(pieces), s) for s in cut.flush()]
    assert [s for _, s in released_at] == ["Paris is the capital of France.", "It lies on the Seine.",
                                           "About two million people live there."]
    first_done = answer.index("France.") + len("France. ")  # its end is known once the space after it arrives
    assert released_at[0][0] <= first_done // 3 < len(pieces) - 1


def test_decimal_and_abbreviation_dots_do_not_end_a_sentence() -> None:
    cut = SentenceCutter()
    out = cut.feed("Pi is about 3.")  # "3." at the end may go on as "3.14": held
    assert out == []
    out += cut.feed("14159 and e is 2.71828. Next")
    assert out == ["Pi is about 3.14159 and e is 2.71828."]
    assert cut.flush() == ["Next"]


@pytest.mark.parametrize("max_chars", [40, 150])
def test_answer_without_any_sentence_break_is_spoken_in_bounded_pieces(max_chars: int) -> None:
    words = [f"word{i}" for i in range(400)]
    answer = " ".join(words)  # an LLM that never ends a sentence
    cut = SentenceCutter(max_chars=max_chars)
    during = []
    for piece in _stream(answer, 7):
        during += cut.feed(piece)
    rest = cut.flush()
    assert len(during) >= len(answer) // max_chars - 2  # released while streaming, not held to the end
    pieces = during + rest
    assert all(len(p) <= max_chars for p in pieces)
    assert " ".join(pieces).split() == words  # nothing lost, no word split in two


def test_text_without_whitespace_is_cut_hard_at_the_bound() -> None:
    cut = SentenceCutter(max_chars=50)
    pieces = cut.feed("x" * 175) + cut.flush()
    assert [len(p) for p in pieces] == [50, 50, 50, 25]


def test_a_long_sentence_is_cut_at_a_clause_mark_first() -> None:
    cut = SentenceCutter(max_chars=60)
    text = "When the weather is fine and the wind is calm, we walk along the river for an hour or two"
    pieces = cut.feed(text) + cut.flush()
    assert pieces[0] == "When the weather is fine and the wind is calm,"
    assert all(len(p) <= 60 for p in pieces)


def test_markdown_is_not_spoken_and_empty_pieces_are_dropped() -> None:
    cut = SentenceCutter()
    pieces = cut.feed("**Sure!** Here it is:\n\n- `ls` lists files.\n*** \n# Done. ") + cut.flush()
    assert pieces == ["Sure! Here it is:", "ls lists files.", "Done."]
    assert speakable(" ** -- ") == ""
    assert speakable("snake_case stays") == "snake_case stays"


def test_line_breaks_end_pieces_and_every_piece_is_speakable() -> None:
    cut = SentenceCutter()
    pieces = cut.feed("One\nTwo three\n\n") + cut.flush()
    assert pieces == ["One", "Two three"]
    assert all(re.search(r"\w", p) for p in pieces)


def test_default_bound_is_what_the_voice_takes_in_one_piece() -> None:
    from apps.voice.sentences import MAX_CHARS
    from runtime.speech.tts import MAX_PIECE_CHARS

    assert MAX_CHARS <= MAX_PIECE_CHARS  # a longer piece would be cut again inside TTS, at worse places


def test_bound_must_hold_a_phrase() -> None:
    with pytest.raises(ValueError, match="at least 8"):
        SentenceCutter(max_chars=3)
