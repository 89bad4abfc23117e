"""Fitting a conversation to the context: the oldest exchanges dropped with a bounded number of renderings.

Before, each dropped exchange meant one more rendering and tokenization of the whole conversation: quadratic in
the number of messages (20,000 empty messages kept a server thread busy for minutes). The search must give
exactly what dropping one exchange at a time gave: held here against that algorithm, kept below as the reference,
on the real SmolLM2 and Gemma 3 templates and vocabularies (both render a message by its position: SmolLM2 adds
its default system prompt before the first turn when there is none, Gemma 3 folds the system prompt into the
first user turn), and on synthetic token counts for many more shapes.
"""

from __future__ import annotations

import random
import time

import pytest

from runtime.errors import BadInput, DeadlineExceeded
from runtime.llm.chat import MAX_CHAT_CHARS, MAX_MESSAGES, _fit, _tokens, check_messages, fit_chat
from runtime.llm.chat_template import ChatTemplate
from runtime.llm.decoding import Truncation, answer_room
from runtime.llm.model import LLM
from runtime.llm.prefix_cache import common_prefix
from tests.runtime.test_chat_injection import GEMMA3

GiB = 1 << 30


class Slot:
    """What fit_chat needs of a model (as an engine slot gives it), with a context of the test's choosing;
    ``start`` returns what would be started. ``renders`` counts the renderings of the conversation."""

    def __init__(self, llm: LLM, n_ctx: int) -> None:
        self.chat_tokenizer, self.n_ctx = llm.chat_tokenizer, n_ctx
        self.chat_template = _Counted(llm.chat_template)

    def start(self, tokens, params, *, n_keep, truncations):
        return list(tokens), n_keep, list(truncations)


class _Counted:
    """A real template that counts its renderings (render_parts renders twice; one count per call)."""

    def __init__(self, template: ChatTemplate) -> None:
        self.template, self.bos, self.renders = template, template.bos, 0

    def render_parts(self, messages, add_generation_prompt=True, tools=None):
        self.renders += 1
        return self.template.render_parts(messages, add_generation_prompt, tools)


def one_at_a_time(llm, messages, params):
    """The algorithm before: drop the oldest exchange, render and tokenize everything again, until it fits."""
    messages = check_messages(list(messages))
    template = llm.chat_template
    system = [m for m in messages if m["role"] == "system"][:1]
    rest = [m for m in messages if m not in system]
    room = answer_room(params.max_tokens, llm.n_ctx)
    dropped_msgs = dropped_tokens = 0
    tokens = _tokens(llm, template, system + rest)
    limit = llm.n_ctx if len(tokens) + room <= llm.n_ctx else llm.n_ctx - llm.n_ctx // 4
    while len(tokens) + room > limit and len(rest) > 1:
        cut = 1
        while cut < len(rest) - 1 and rest[cut]["role"] != "user":
            cut += 1
        rest = rest[cut:]
        dropped_msgs += cut
        before = len(tokens)
        tokens = _tokens(llm, template, system + rest)
        dropped_tokens += before - len(tokens)
    truncations = [Truncation("turns", dropped_tokens, 0, dropped_msgs)] if dropped_msgs else []
    n_keep = 0
    if system:
        head = _tokens(llm, template, system, add_generation_prompt=False)
        n_keep = common_prefix(head, tokens)
    return llm.start(tokens, params, n_keep=n_keep, truncations=truncations)


@pytest.fixture(scope="module")
def models(smollm, gemma):
    with LLM.load(smollm, memory=GiB, ctx=512, threads=2) as smol, LLM.load(gemma, memory=GiB, ctx=512, threads=2) as gem:
        bos, eos = gem.backend.special_text("bos"), gem.backend.special_text("eos")
        gem.chat_template = ChatTemplate(GEMMA3, bos, eos, "gemma3 (Gemma 3 template)")
        yield {"smollm": smol, "gemma": gem}


def slot_params(models):
    return models["smollm"].params(max_tokens=16)


def _conversations() -> list[list[dict[str, str]]]:
    rng = random.Random(7)
    words = "valve pressure line four shift reading alarm belt motor sensor ok late cleaned".split()

    def text(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n))

    turns = []
    for i in range(30):  # a long exchange of turns of very different lengths
        turns += [{"role": "user", "content": f"entry {i}: {text(rng.randint(0, 40))}"},
                  {"role": "assistant", "content": text(rng.randint(1, 25))}]
    return [
        [{"role": "system", "content": "You log the shift. " + text(20)}, *turns, {"role": "user", "content": "Summarize."}],
        [*turns, {"role": "user", "content": "And now?"}],  # no system prompt: SmolLM2 adds its own at the start
        # runs of user messages, an assistant first, a second system message in the middle, empty messages
        [{"role": "assistant", "content": "Hello."}, *[{"role": "user", "content": text(rng.randint(0, 12))} for _ in range(40)]],
        [{"role": "user", "content": ""}] * 60,
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text(30)},
         {"role": "system", "content": "Now be briefer."}, *turns[:24], {"role": "assistant", "content": text(200)},
         {"role": "user", "content": "ok"}],
        [{"role": "system", "content": text(80)}, {"role": "user", "content": text(300)}],  # cannot be cut: refused later
    ]


@pytest.mark.parametrize("family", ["smollm", "gemma"])
def test_the_search_keeps_what_dropping_one_exchange_at_a_time_kept(models, family) -> None:
    llm = models[family]
    compared = cut = 0
    for messages in _conversations():
        for n_ctx, max_tokens in ((64, 16), (150, 100), (333, 16), (512, 100), (4096, 16)):
            params = llm.params(max_tokens=max_tokens)
            slot = Slot(llm, n_ctx)
            want = one_at_a_time(slot, messages, params)
            renders_before = slot.chat_template.renders
            got = fit_chat(slot, messages, params)
            renders = slot.chat_template.renders - renders_before
            assert got == want, (family, n_ctx, max_tokens, len(messages))
            exchanges = 1 + sum(m["role"] == "user" for m in messages[1:])
            assert renders <= 2 * exchanges.bit_length() + 3, (renders, exchanges)
            compared += 1
            cut += bool(want[2])
    assert cut >= compared // 3, "too few of the cases had turns to drop: the comparison says little"


def _linear(sizes: list[int], rest: list[dict[str, str]], room: int, limit: int) -> tuple[int, int]:
    start = 0
    while sum(sizes[start:]) + room > limit and len(rest) - start > 1:
        start += 1
        while start < len(rest) - 1 and rest[start]["role"] != "user":
            start += 1
    return start, sum(sizes[start:])


def test_the_search_matches_the_linear_drop_on_many_shapes() -> None:
    # Token counts made up (each message's own, summed): the search alone, over shapes no real test could cover.
    rng = random.Random(11)
    for case in range(3000):
        n = rng.randint(2, 60)
        rest = [{"role": rng.choice(("user", "user", "assistant", "system")), "content": ""} for _ in range(n - 1)]
        rest.append({"role": "user", "content": ""})
        sizes = [rng.choice((0, 1, 3, 10, 50, 400)) for _ in range(n)]
        room, limit = rng.randint(1, 50), rng.randint(1, 600)
        if sum(sizes) + room <= limit:
            continue
        calls = []

        def render(start: int, calls: list[int] = calls, sizes: list[int] = sizes) -> list[int]:
            calls.append(start)
            return [0] * sum(sizes[start:])

        start, tokens = _fit(render, rest, room, limit, None)
        assert (start, len(tokens)) == _linear(sizes, rest, room, limit), case
        exchanges = 1 + sum(m["role"] == "user" for m in rest[1:])
        assert len(calls) == len(set(calls)) and len(calls) <= 2 * exchanges.bit_length() + 1, (case, calls)


def test_20000_messages_are_refused_before_any_rendering(models) -> None:
    slot = Slot(models["smollm"], 512)
    started = time.monotonic()
    with pytest.raises(BadInput, match=f"a chat of 20000 messages is too long: at most {MAX_MESSAGES} are accepted"):
        fit_chat(slot, [{"role": "user", "content": ""}] * 20_000, slot_params(models))
    assert slot.chat_template.renders == 0 and time.monotonic() - started < 1.0
    with pytest.raises(BadInput, match=f"characters of content is too long: at most {MAX_CHAT_CHARS} are accepted"):
        fit_chat(slot, [{"role": "user", "content": "x" * (MAX_CHAT_CHARS // 2 + 1)}] * 2, slot_params(models))
    assert slot.chat_template.renders == 0


def test_the_most_messages_fit_in_a_bounded_time(models) -> None:
    # 2,048 messages into a 512-token context: ~20 renderings, where one per dropped exchange took over a minute.
    slot = Slot(models["smollm"], 512)
    messages = [{"role": "user", "content": f"note {i}"} for i in range(MAX_MESSAGES)]
    started = time.monotonic()
    tokens, _, truncations = fit_chat(slot, messages, slot_params(models))
    assert time.monotonic() - started < 20.0  # a loaded 2-core machine; the old way was past 60 s
    assert slot.chat_template.renders <= 2 * MAX_MESSAGES.bit_length() + 3
    assert truncations[0].messages_dropped > MAX_MESSAGES - 100 and len(tokens) <= 512 - 512 // 4


def test_an_interrupt_stops_the_fitting_between_renderings(models) -> None:
    slot = Slot(models["smollm"], 256)
    messages = [{"role": "user", "content": f"note {i}"} for i in range(500)]
    calls = []

    def interrupt() -> None:
        calls.append(slot.chat_template.renders)
        if len(calls) == 3:
            raise DeadlineExceeded("the deadline passed")

    with pytest.raises(DeadlineExceeded):
        fit_chat(slot, messages, slot_params(models), interrupt)
    assert calls == [0, 1, 2]  # before the first rendering, then before each next one; none after the raise
    calls.clear()
    fit_chat(slot, messages[:3], slot_params(models), interrupt)  # fits at once: asked once, before rendering
    assert calls == [2]


def test_a_conversation_that_would_lose_turns_is_refused_after_one_rendering_without_truncate(models) -> None:
    # The server's fit is decided once: without "truncate" the conversation is refused as soon as its one whole
    # rendering shows it does not fit, before any turn is dropped (the search's renderings were thrown away before).
    slot = Slot(models["smollm"], 256)
    messages = [{"role": "user", "content": f"note {i} " * 8} for i in range(60)]
    with pytest.raises(BadInput, match=r"the conversation is \d+ tokens; this model's context holds 240 prompt tokens"):
        fit_chat(slot, messages, slot_params(models), truncate=False)
    assert slot.chat_template.renders == 1
    kept = fit_chat(slot, messages, slot_params(models), truncate=True)
    assert kept.truncations and kept.truncations[0].kind == "turns"
