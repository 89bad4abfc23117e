"""Chat: render the model's own chat template and keep the conversation in context.

The template is the Jinja2 text shipped in the GGUF (``tokenizer.chat_template``),
rendered in a bounded sandbox (runtime/llm/chat_template.py). Only the template's own
markers become control tokens; message content is tokenized as text
(runtime/llm/chat_tokens.py). When a conversation no longer fits, the oldest turns are
dropped (never the system prompt) and the drop is reported; the engine then
shifts the cached turns that remain instead of recomputing them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, Protocol

from runtime.errors import BadInput
from runtime.llm.chat_template import ChatTemplate
from runtime.llm.chat_tokens import ChatTokenizer
from runtime.llm.decoding import Result, Truncation, answer_room
from runtime.llm.prefix_cache import common_prefix
from runtime.llm.sampling import SamplingParams

log = logging.getLogger(__name__)
ROLES = ("system", "user", "assistant")
MAX_MESSAGES = 2048  # messages in one chat (OpenAI's own limit): each one is rendered, counted and tokenized
MAX_CHAT_CHARS = 4 << 20  # characters of content in one chat, all messages together


def check_messages(messages: Any, *, tool_roles: bool = False) -> list[dict[str, Any]]:
    """``messages`` checked: a non-empty list of at most :data:`MAX_MESSAGES` role/content dicts, at most
    :data:`MAX_CHAT_CHARS` characters of content in all, the last one the user's (BadInput otherwise).
    ``tool_roles``: a template that renders tools reads ``tool`` messages too, and may end with one."""
    roles = (*ROLES, "tool") if tool_roles else ROLES
    if not isinstance(messages, list) or not messages:
        raise BadInput("a chat needs a non-empty list of messages")
    if len(messages) > MAX_MESSAGES:  # before any per-message work
        raise BadInput(f"a chat of {len(messages)} messages is too long: at most {MAX_MESSAGES} are accepted")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or msg.get("role") not in roles or not isinstance(msg.get("content"), str):
            raise BadInput(f"message {i} must be {{'role': one of {', '.join(roles)}, 'content': text}}, got {msg!r}"[:300])
    chars = sum(len(m["content"]) for m in messages)
    if chars > MAX_CHAT_CHARS:
        raise BadInput(f"a chat of {chars} characters of content is too long: at most {MAX_CHAT_CHARS} are accepted")
    if messages[-1]["role"] not in (("user", "tool") if tool_roles else ("user",)):
        raise BadInput("the last message of a chat must come from the user")
    return messages


def _no_control_text(llm: ChatModel, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> None:
    """A template that renders tools writes tool definitions and call arguments as its own text, where control
    tokens are parsed: refused when any of them holds one's text (as message content never becomes one)."""
    data = json.dumps([tools, [m.get("tool_calls") for m in messages]], ensure_ascii=False)
    found = next((t.text for t in llm.chat_tokenizer.specials if t.control and t.text in data), None)
    if found is not None:
        raise BadInput(f"a tool definition or call argument holds the control token {found!r}: refusing rather than "
                       "letting client text become control tokens")


class ChatModel(Protocol):
    """What fitting a conversation needs of a model: its template, its chat tokenizer and the context one
    conversation gets (the single stream's whole context, or one engine slot)."""

    @property
    def chat_template(self) -> ChatTemplate: ...

    @property
    def chat_tokenizer(self) -> ChatTokenizer: ...

    @property
    def n_ctx(self) -> int: ...


class ChatPrompt(NamedTuple):
    """A conversation as a prompt: its tokens, the start a context shift keeps (the system prompt) and the turns
    dropped to fit it."""

    tokens: list[int]
    n_keep: int
    truncations: list[Truncation]


def fit_chat(llm: ChatModel, messages: list[dict[str, Any]], params: SamplingParams,
             interrupt: Callable[[], None] | None = None, *, truncate: bool = True,
             tools: list[dict[str, Any]] | None = None) -> ChatPrompt:
    """The conversation as the model's prompt; the oldest exchanges dropped when it does not fit, the one
    decision of a chat's fit. Without ``truncate`` a conversation that would lose turns is refused instead, before
    any is dropped (BadInput naming its tokens and the limit); a last message that does not fit alone is left to
    the prompt's own fit (runtime.llm.decoding.fit_prompt), which cuts or refuses it.

    ``interrupt``: called before each rendering; it raises to stop the fitting (a deadline passed, the client left).
    """
    native = tools is not None or any("tool_calls" in m or m.get("role") == "tool" for m in messages)
    messages = check_messages(list(messages), tool_roles=native)
    if native:
        _no_control_text(llm, messages, tools)
    template = llm.chat_template
    system = [m for m in messages if m["role"] == "system"][:1]
    rest = [m for m in messages if m not in system]
    room = answer_room(params.max_tokens, llm.n_ctx)
    if interrupt is not None:
        interrupt()
    whole = _tokens(llm, template, system + rest, tools=tools)
    tokens, dropped_msgs = whole, 0
    if len(whole) + room > llm.n_ctx and len(rest) > 1:
        if not truncate:
            raise BadInput(f"the conversation is {len(whole)} tokens; this model's context holds {llm.n_ctx - room} "
                           "prompt tokens with room to answer: shorten it, or send \"truncate\": true to drop its "
                           "oldest part")
        # Once turns must go, free a quarter of the context more than needed, so that the
        # next few turns fit without another drop (each drop costs a cache shift).
        limit = llm.n_ctx - llm.n_ctx // 4
        dropped_msgs, tokens = _fit(lambda start: _tokens(llm, template, system + rest[start:], tools=tools), rest, room,
                                    limit, interrupt)
    truncations = [Truncation("turns", len(whole) - len(tokens), 0, dropped_msgs)] if dropped_msgs else []
    if dropped_msgs:
        log.warning("conversation exceeds the %d-token context: dropped the %d oldest messages", llm.n_ctx, dropped_msgs)
    n_keep = 0
    if system:
        head = _tokens(llm, template, system, add_generation_prompt=False, tools=tools)
        n_keep = common_prefix(head, tokens)
    return ChatPrompt(tokens, n_keep, truncations)


def _fit(render: Callable[[int], list[int]], rest: list[dict[str, str]], room: int, limit: int,
         interrupt: Callable[[], None] | None) -> tuple[int, list[int]]:
    """(messages dropped, tokens): the longest tail of whole exchanges whose rendering leaves ``room`` within
    ``limit``, else the last message alone. ``render(start)``: the tokens of the conversation kept from ``start``.

    The result is that of dropping the oldest exchange (the messages up to the next user message) and rendering
    again until the conversation fits, but found with at most 2 log2(exchanges) + 1 renderings instead of one per
    exchange: a search from the newest end, doubling its step, then halving it. Each candidate is rendered whole,
    so a template that renders a message by its position (the first turn, a count of turns) is still exact; the
    search assumes that dropping an exchange never lengthens the rendering. The whole conversation is known not to fit.
    """
    starts = [0] + [i for i in range(1, len(rest)) if rest[i]["role"] == "user"]  # where a kept tail may begin
    seen: dict[int, list[int]] = {}

    def fits(k: int) -> bool:
        if k not in seen:
            if interrupt is not None:
                interrupt()
            seen[k] = render(starts[k])
        return len(seen[k]) + room <= limit

    last = len(starts) - 1
    if not fits(last):  # not even the last message fits: it is kept alone, and the prompt is cut or refused later
        return starts[last], seen[last]
    good, step = last, 1  # fits(good); find the first k that fits, between bad (known not to) and good
    bad = 0
    while good - step > 0:
        if not fits(good - step):
            bad = good - step
            break
        good -= step
        step *= 2
    while good - bad > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return starts[good], seen[good]


def _tokens(llm: ChatModel, template: ChatTemplate, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
            tools: list[dict[str, Any]] | None = None) -> list[int]:
    text, parts, exact = template.render_parts(messages, add_generation_prompt, tools)
    add_bos = not (template.bos and text.startswith(template.bos))
    return llm.chat_tokenizer.encode_chat(text, parts, exact, add_bos=add_bos)


class Stream(Protocol):
    """A generation being streamed (runtime.llm.generation.Generation): text pieces, then its result."""

    result: Result | None

    def __iter__(self) -> Iterator[str]: ...

    def finish(self) -> Result: ...


class Chats(Protocol):
    """A model a session chats with (runtime.llm.model.LLM)."""

    defaults: SamplingParams

    def chat(self, messages: list[dict[str, str]], params: SamplingParams | None = None) -> Stream: ...


class ChatSession:
    """A conversation that remembers its turns (used by ``edgerun chat``)."""

    def __init__(self, llm: Chats, system: str | None = None, params: SamplingParams | None = None) -> None:
        self.llm = llm
        self.params = params or llm.defaults
        self.messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
        self.truncations = 0

    def send(self, text: str) -> Stream:
        self.messages.append({"role": "user", "content": text})
        try:
            gen = self.llm.chat(self.messages, self.params)
        except BaseException:
            self.messages.pop()  # a refused message does not stay in the conversation
            raise
        return _Recording(gen, self)


class _Recording:
    """Wraps a generation to append the reply to the session when it finishes."""

    def __init__(self, gen: Stream, session: ChatSession) -> None:
        self.gen, self.session = gen, session

    def __iter__(self) -> Iterator[str]:
        yield from self.gen
        self._record()

    def finish(self) -> Result:
        result = self.gen.finish()
        self._record()
        return result

    @property
    def result(self) -> Result | None:
        return self.gen.result

    def _record(self) -> None:
        result, messages = self.gen.result, self.session.messages
        if result is None or not messages or messages[-1]["role"] != "user":
            return
        messages.append({"role": "assistant", "content": result.text})
        self.session.truncations += len(result.truncations)
        # Messages that left the context leave the session too: the next turn starts
        # from what the model actually saw, and history does not grow without bound.
        dropped = sum(t.messages_dropped for t in result.truncations)
        if dropped:
            first = 1 if messages[0]["role"] == "system" else 0
            del messages[first : first + dropped]
