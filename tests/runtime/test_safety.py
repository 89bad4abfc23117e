"""runtime.serving.safety: the filter chain on input and on streamed output, the built-in filters' bounds, and a classifier
filter over a real (tiny, generated) edgerun classifier bundle."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.errors import BadInput
from runtime.serving.safety import (
    MAX_PATTERN_CHARS,
    MAX_PATTERNS,
    Blocked,
    Blocklist,
    ClassifierFilter,
    FilterChain,
    RegexFilter,
    SizeLimit,
    Verdict,
    bundle_scorer,
)


def _stream(chain: FilterChain, pieces: list[str]) -> tuple[str, Blocked | None]:
    """What a client would have received, and the block (if any)."""
    checker, sent = chain.stream_checker(), []
    try:
        for piece in pieces:
            sent.append(checker.feed(piece))
        sent.append(checker.finish())
    except Blocked as exc:
        return "".join(sent), exc
    return "".join(sent), None


# --- input ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, blocked", [
    ("this is BAD news", True),        # case-insensitive
    ("bad", True),                     # the whole text
    ("(bad)", True),                   # punctuation is a boundary
    ("badge and abad and badly", False),  # substrings of longer words never block
    ("ｂａｄ idea", True),               # fullwidth letters fold to plain ones (NFKC)
    ("b\u200bad idea", True),          # a zero-width space inside the word does not hide it
    ("the evil plan", True),           # a phrase
    ("the evil\n  plan", True),        # a phrase across any whitespace
    ("the evil planner", False),       # ...but still whole words
    ("évil plan", False),              # a letter with an accent is another word
    ("STRASSE", True),                 # case folding, not only lower-casing: "straße" is on the list
    ("straßenbahn", False),
])
def test_blocklist_whole_words_case_insensitive(text: str, blocked: bool) -> None:
    chain = FilterChain([Blocklist(["bad", "evil plan", "Straße"])])
    if blocked:
        with pytest.raises(Blocked) as info:
            chain.check_input(text)
        assert info.value.reason == "blocklist" and info.value.stage == "input"
        assert isinstance(info.value, BadInput) and "\n" not in str(info.value)
    else:
        chain.check_input(text)


@pytest.mark.parametrize("invisible", [
    "\u2062",      # invisible times (a format character, like the zero-width space)
    "\u2066",      # a bidi isolate
    "\u180e",      # Mongolian vowel separator
    "\U000e0062",  # a tag character
    "\u034f",      # combining grapheme joiner (not a format character, but default-ignorable)
    "\ufe0f",      # a variation selector
])
def test_every_character_that_renders_as_nothing_is_ignored_not_only_a_listed_few(invisible: str) -> None:
    chain = FilterChain([Blocklist(["bad"])])
    with pytest.raises(Blocked):
        chain.check_input(f"b{invisible}ad idea")
    assert _stream(chain, [f"so b{invisible}", "ad. "])[1] is not None


def test_size_limit_blocks_with_the_count_and_the_limit() -> None:
    chain = FilterChain([SizeLimit(10)])
    chain.check_input("x" * 10)
    with pytest.raises(Blocked, match="11 characters, the limit is 10") as info:
        chain.check_input("x" * 11)
    assert info.value.reason == "size"


def test_size_limit_is_for_input_unless_asked() -> None:
    assert SizeLimit(3).check("long sentence", "output") is None
    assert SizeLimit(3, stages=["output"]).check("long sentence", "output") is not None


def test_regex_filter_blocks_and_names_the_pattern_not_the_text() -> None:
    chain = FilterChain([RegexFilter([r"\bcard\s*\d{4}", r"\d{3}-\d{2}-\d{4}"])])
    chain.check_input("nothing here 123-45")
    with pytest.raises(Blocked, match="pattern 1 matched") as info:
        chain.check_input("my number is 123-45-6789")
    assert info.value.reason == "regex" and "6789" not in str(info.value)


def test_first_filter_to_block_gives_the_reason() -> None:
    chain = FilterChain([SizeLimit(5), Blocklist(["bad"])])
    with pytest.raises(Blocked) as info:
        chain.check_input("bad bad bad")
    assert info.value.reason == "size"


def test_empty_chain_passes_everything() -> None:
    FilterChain().check_input("anything at all")
    assert _stream(FilterChain(), ["a. ", "b"]) == ("a. b", None)


# --- streamed output --------------------------------------------------------------------------------------------


def test_blocked_word_split_across_pieces_is_caught_before_any_of_it_is_sent() -> None:
    chain = FilterChain([Blocklist(["forbidden"])])
    sent, blocked = _stream(chain, ["All fine here. Then the for", "bid", "den word", " appears. More."])
    assert blocked is not None and blocked.stage == "output" and blocked.reason == "blocklist"
    assert sent == "All fine here. "  # the sentence before passed; nothing of the blocked one went out
    assert "forbidden" not in str(blocked)  # output text is never echoed


def test_blocked_word_in_the_last_unfinished_sentence_is_caught_at_finish() -> None:
    sent, blocked = _stream(FilterChain([Blocklist(["secret"])]), ["It is a sec", "ret"])
    assert blocked is not None and sent == ""


def test_clean_stream_comes_out_whole_and_sentence_by_sentence() -> None:
    chain = FilterChain([Blocklist(["forbidden"])])
    checker = chain.stream_checker()
    assert checker.feed("Pi is 3.14 and") == ""  # "3.14" does not end a sentence
    assert checker.feed(" more. Next") == "Pi is 3.14 and more. "
    assert checker.feed(" line\nand") == "Next line\n"
    assert checker.finish() == "and"


def test_substring_of_a_longer_word_in_output_does_not_block() -> None:
    sent, blocked = _stream(FilterChain([Blocklist(["ass"])]), ["The cl", "ass assi", "stant passed. "])
    assert blocked is None and sent == "The class assistant passed. "


@pytest.mark.parametrize("pieces, limit, released", [
    (["aaaa bbbb evil pl", "an"], 16, "aaaa bbbb evil "),  # the run-on part is cut between the phrase's two words
    (["forbi", "dden"], 4, "forbi"),  # no whitespace at all: cut inside the word
])
def test_a_phrase_across_a_forced_cut_is_still_caught(pieces: list[str], limit: int, released: str) -> None:
    checker = FilterChain([Blocklist(["evil plan", "forbidden"])]).stream_checker(max_sentence_chars=limit)
    assert checker.feed(pieces[0]) == released
    with pytest.raises(Blocked):
        for piece in pieces[1:]:
            checker.feed(piece)
        checker.finish()


@pytest.mark.parametrize("pieces", [
    ["We made an evil\nplan. "],             # one piece: the line break is whitespace inside the phrase
    ["We made an evil\n", "plan today. "],   # released at the line break, the phrase completed by the next piece
    ["Then: evil\n\n  plan. "],
])
def test_a_phrase_across_a_line_break_in_the_output_is_caught(pieces: list[str]) -> None:
    # A line break ends a piece of streamed text but not a sentence: a phrase matches across any whitespace, as on input.
    chain = FilterChain([Blocklist(["evil plan"])])
    with pytest.raises(Blocked):
        chain.check_input("".join(pieces))
    sent, blocked = _stream(chain, pieces)
    assert blocked is not None and "plan" not in sent


def test_without_output_filters_nothing_is_held_back() -> None:
    # The default chain is a size limit on the input: streaming must not wait for sentence ends then.
    checker = FilterChain([SizeLimit(100)]).stream_checker()
    assert [checker.feed(p) for p in ("Hel", "lo", " there")] == ["Hel", "lo", " there"] and checker.finish() == ""
    assert FilterChain([SizeLimit(100, stages=["input", "output"])]).stream_checker().feed("Hel") == ""


def test_a_blocked_checker_stays_blocked() -> None:
    checker = FilterChain([Blocklist(["bad"])]).stream_checker()
    with pytest.raises(Blocked):
        checker.feed("so bad. ")
    with pytest.raises(Blocked):
        checker.feed("fine. ")
    with pytest.raises(Blocked):
        checker.finish()


def test_a_run_on_output_is_checked_at_word_boundaries() -> None:
    checker = FilterChain([Blocklist(["bad"])]).stream_checker(max_sentence_chars=20)
    out = checker.feed("word " * 5 + "ba")  # 27 characters, no sentence end: released up to the last space
    assert out == "word " * 5
    with pytest.raises(Blocked):
        checker.feed("d and more text")  # "bad" was not split by the forced check
        checker.finish()


# --- configuration errors: one line, BadInput ------------------------------------------------------------------


@pytest.mark.parametrize("patterns, message", [
    (["(unclosed"], r"regex filter pattern 0 \('\(unclosed'\) does not compile: missing \), unterminated subpattern"),
    (["ok", "[z-a]"], r"regex filter pattern 1 .* does not compile: bad character range"),
    (["x" * (MAX_PATTERN_CHARS + 1)], rf"pattern 0 is {MAX_PATTERN_CHARS + 1} characters long; the limit is {MAX_PATTERN_CHARS}"),
    (["a"] * (MAX_PATTERNS + 1), rf"has {MAX_PATTERNS + 1} patterns; the limit is {MAX_PATTERNS}"),
    ([""], "pattern 0 .* is empty"),
    ("abc", "a list of strings, not one string"),
])
def test_bad_regex_configuration(patterns, message: str) -> None:
    with pytest.raises(BadInput, match=message) as info:
        RegexFilter(patterns)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("make, message", [
    (lambda: Blocklist(["ok", "  "]), "blocklist entry 1 .* is empty"),
    (lambda: Blocklist(["x" * 101]), "entry 0 is 101 characters long"),
    (lambda: SizeLimit(0), "size limit 0 is not valid"),
    (lambda: Blocklist(["a"], stages=["inbound"]), r"stages \['inbound'\] are not valid; use one or both of \['input', 'output'\]"),
    (lambda: FilterChain([object()]), "object is not a filter"),
    (lambda: ClassifierFilter(lambda t: {}, [], 0.5), "at least one label"),
    (lambda: ClassifierFilter(lambda t: {}, ["x"], 1.5), r"threshold 1.5 is not valid; give a number in \(0, 1\]"),
])
def test_bad_filter_configuration(make, message: str) -> None:
    with pytest.raises(BadInput, match=message):
        make()


def test_custom_filter_plugs_into_the_chain() -> None:
    class NoShouting:
        def check(self, text: str, stage: str) -> Verdict | None:
            return Verdict("shouting", "all capitals") if text.isupper() else None

    sent, blocked = _stream(FilterChain([NoShouting()]), ["Hello there. ", "STOP THAT. ", "ok"])
    assert sent == "Hello there. " and blocked is not None and blocked.reason == "shouting"


# --- a classifier filter over a real edgerun classifier bundle -------------------------------------------------


@pytest.fixture(scope="module")
def tiny_classifier(tmp_path_factory: pytest.TempPathFactory):
    from runtime.classify.classifier import Classifier
    from tests.runtime.modelgen import vision_bundle

    bundle = vision_bundle(tmp_path_factory.mktemp("safety") / "tiny", "onnx")
    with Classifier.load(str(bundle), threads=1, target="cpu") as clf:
        yield clf


def encode_as_image(text: str) -> np.ndarray:
    """A stand-in text encoder until edgerun has a text classifier bundle: the share of capital letters, digits
    and punctuation become the image's three channels (8x8, NCHW, a batch of one)."""
    n = max(len(text), 1)
    shares = [sum(c.isupper() for c in text) / n, sum(c.isdigit() for c in text) / n,
              sum(not c.isalnum() and not c.isspace() for c in text) / n]
    return np.broadcast_to(np.array(shares, np.float32)[None, :, None, None], (1, 3, 8, 8)).copy()


def test_classifier_filter_over_a_bundle_blocks_what_it_scores_high(tiny_classifier) -> None:
    scorer = bundle_scorer(tiny_classifier, encode_as_image)
    shouting, calm = scorer("ALL CAPS!!!"), scorer("quiet words only")
    # The model's logits are PROJECTION @ channel means: pick the label that capitals push up the most.
    label = max(shouting, key=lambda k: shouting[k] - calm[k])
    threshold = (shouting[label] + calm[label]) / 2
    assert shouting[label] > threshold > calm[label]
    chain = FilterChain([ClassifierFilter(scorer, [label], threshold)])
    chain.check_input("quiet words only")
    with pytest.raises(Blocked, match=f"scored .* for '{label}'") as info:
        chain.check_input("ALL CAPS!!!")
    assert info.value.reason == "classifier"
    sent, blocked = _stream(chain, ["quiet words only. ", "ALL CAPS!!! ", "quiet again"])
    assert sent == "quiet words only. " and blocked is not None and blocked.stage == "output"


def test_classifier_filter_refuses_labels_the_bundle_does_not_have(tiny_classifier) -> None:
    with pytest.raises(BadInput, match=r"labels \['toxic'\] are not the classifier's; valid: \['class-0'"):
        ClassifierFilter(bundle_scorer(tiny_classifier, encode_as_image), ["toxic"], 0.5)


def test_bundle_scorer_needs_a_classifier() -> None:
    with pytest.raises(BadInput, match="str is not an edgerun classifier"):
        bundle_scorer("model.onnx", encode_as_image)

