"""OpenAI's request and response shapes: bodies checked into :class:`GenArgs`, results turned back into JSON.

Checks name the JSON field and what is valid, as OpenAI's own 400s do. Fields OpenAI clients send that change
nothing here (``user``, unknown ones...) are ignored; fields that would change the answer in a way this server cannot
honour (``n`` > 1, ``best_of``, ``echo``, legacy ``functions``) are refused rather than silently dropped.
``response_format`` (``json_object``, ``json_schema``), edgerun's own ``grammar`` (GBNF) and ``tools`` constrain
decoding (runtime/llm/grammar.py, runtime/llm/tools.py): the answer is valid by construction, not checked
afterwards. ``logprobs``, ``top_logprobs`` and ``logit_bias`` are the sampler chain's. ``max_completion_tokens``
(newer clients) is ``max_tokens``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.responses import JSONResponse

from apps.server.security import BodyTooLarge, Forbidden, Unauthorized
from runtime.errors import BadInput, Cancelled, DeadlineExceeded, DoesNotFit, EdgerunError, QueueFull, one_line
from runtime.llm.chat import MAX_CHAT_CHARS, MAX_MESSAGES, ROLES
from runtime.llm.decoding import Result, TokenLogprob, Truncation
from runtime.llm.grammar import JSON_OBJECT, Grammar, gbnf
from runtime.llm.json_schema import schema_grammar
from runtime.llm.sampling import LOGIT_BIAS, MAX_LOGIT_BIAS, MAX_TOP_LOGPROBS, check
from runtime.llm.tools import NAME as TOOL_NAME
from runtime.llm.tools import CallReader, ToolCall, Tools
from runtime.serving.safety import Blocked

SAMPLING_KEYS = ("max_tokens", "temperature", "top_p", "seed", "stop")
REFUSED = {  # field -> (values that are fine besides null, why another is refused); compared with their JSON types
    "n": ((1,), "this server returns one choice: leave n out or set it to 1"),
    "best_of": ((1,), "this server returns one choice: leave best_of out or set it to 1"),
    "echo": ((False,), "echo is not supported"),
    "functions": (([],), "functions are not supported"),
}
FORMAT_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's rule for response_format.json_schema.name


def _allowed(value: Any, fine: tuple[Any, ...]) -> bool:
    """``value`` is null or one of ``fine`` with the same JSON type (true is not 1, 1.0 is not 1)."""
    return value is None or any(type(value) is type(ok) and value == ok for ok in fine)


class UnknownModel(BadInput):
    """A well-formed model name that this server does not serve (HTTP 404)."""


class NotReady(EdgerunError):
    """The server is starting or stopping (HTTP 503)."""


class ShuttingDown(Cancelled):
    """An answer stopped because the server is shutting down (HTTP 503; a cancel, not a fault of its version)."""


@dataclass
class GenArgs:
    model: str
    stream: bool = False
    include_usage: bool = False
    sampling: dict[str, Any] = field(default_factory=dict)  # checked overrides of the model's defaults
    truncate: bool = False  # a prompt that does not fit: drop its oldest part instead of refusing it
    priority: str | None = None
    deadline_ms: int | None = None
    messages: list[dict[str, Any]] | None = None  # chat: role, content (text); tool_calls, tool_call_id
    prompt: str | None = None  # completions
    tools: Tools | None = None  # chat: the tools the answer may call (read back as calls unless tool_choice is none)
    tooled: bool = False  # chat: tools, or tool calls and results in the history (put in the model's tool format)

    def cache_payload(self) -> dict[str, Any]:
        messages = [{**m, "tool_calls": [dataclasses.astuple(c) for c in m["tool_calls"]]} if "tool_calls" in m else m
                    for m in self.messages or []]
        tools = [dataclasses.astuple(t) for t in self.tools.tools] if self.tools is not None else None
        choice = (self.tools.choice, self.tools.parallel) if self.tools is not None else None
        return {"messages": messages, "prompt": self.prompt, "truncate": self.truncate, "tools": tools, "choice": choice}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def parse_json(body: bytes) -> dict[str, Any]:
    """The body as a JSON object; BadInput for anything else, however it fails (bad bytes, NaN, a number too long
    for Python's int, nesting deeper than the parser's recursion)."""
    try:
        data = json.loads(body, parse_constant=_no_constant)
    except RecursionError:
        raise BadInput("the request body is not valid JSON here (nested too deeply)") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, int digit limit, NaN/Infinity
        raise BadInput(f"the request body is not valid JSON ({one_line(exc, 200)})") from None
    if not isinstance(data, dict):
        raise BadInput(f"the request body must be a JSON object, got {type(data).__name__}")
    _check_text(data)
    return data


def _check_text(data: Any) -> None:
    """BadInput naming the first string or key that holds a lone surrogate (``"\\ud800"``: half of a \\u escape
    pair, valid JSON but not text, which the tokenizer cannot encode). One C-speed encode finds out; the walk that
    names the field runs only when there is one."""
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
        return
    except UnicodeEncodeError:
        pass
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        value, path = stack.pop()
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            where = f"{path}.{key}" if isinstance(key, str) else f"{path}[{key}]"
            for text in ((key, item) if isinstance(key, str) else (item,)):
                if isinstance(text, str) and not _encodes(text):
                    raise BadInput(f"{where.lstrip('.')[:80]!a} holds a lone surrogate (half of a \\u escape pair), "
                                   "which is not text: send the character as UTF-8 or as a whole surrogate pair")
            stack.append((item, where))


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _flag(data: dict[str, Any], key: str) -> bool:
    value = data.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadInput(f"{key} must be true or false, got {value!r}"[:200])
    return value


def grammar_of(data: dict[str, Any]) -> Grammar | None:
    """The grammar a request constrains its answer to: ``response_format`` as OpenAI defines it (``text``,
    ``json_object``, ``json_schema`` with ``name`` and ``schema``), or edgerun's ``grammar`` (GBNF text)."""
    fmt, own = data.get("response_format"), data.get("grammar")
    if own is not None:
        if fmt is not None and fmt != {"type": "text"}:
            raise BadInput("grammar and response_format both constrain the answer: give one of them")
        return gbnf(own, "grammar")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise BadInput('response_format must be an object like {"type": "json_object"}')
    kind = fmt["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return JSON_OBJECT
    if kind != "json_schema":
        raise BadInput(f"response_format.type {kind[:40]!r} is not valid: use text, json_object or json_schema")
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or "schema" not in spec:
        raise BadInput('response_format.json_schema must be an object with "name" and "schema"')
    name = spec.get("name")
    if not isinstance(name, str) or not FORMAT_NAME.fullmatch(name):
        raise BadInput("response_format.json_schema.name must be 1-64 of a-z A-Z 0-9 _ -")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise BadInput("response_format.json_schema.strict must be true or false")
    return schema_grammar(spec["schema"], "response_format.json_schema.schema")


def _common(data: dict[str, Any], max_tokens_cap: int) -> GenArgs:
    for key, (fine, why) in REFUSED.items():
        if not _allowed(data.get(key), fine):
            raise BadInput(f"{key}: {why}")
    if "model" not in data:
        raise BadInput("model is missing: name one of GET /v1/models")
    args = GenArgs(model=data["model"], stream=_flag(data, "stream"), truncate=_flag(data, "truncate"))
    options = data.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise BadInput("stream_options must be an object like {\"include_usage\": true}")
        args.include_usage = _flag(options, "include_usage")
    for key in SAMPLING_KEYS:
        field_name = key
        if key == "max_tokens" and data.get("max_completion_tokens") is not None:  # newer clients' name for it
            field_name = "max_completion_tokens"
        value = data.get(field_name)
        if value is None:
            continue
        if key == "stop" and isinstance(value, str):
            value = [value]
        args.sampling[key] = check(key, value, field_name)
        if key == "max_tokens" and value > max_tokens_cap:
            raise BadInput(f"{field_name} {value} is over this server's limit of {max_tokens_cap}")
    grammar = grammar_of(data)
    if grammar is not None:
        args.sampling["grammar"] = grammar
    bias = data.get("logit_bias")
    if bias is not None:
        args.sampling["logit_bias"] = _logit_bias(bias)
    if data.get("priority") is not None:
        if not isinstance(data["priority"], str):
            raise BadInput("priority must be one of urgent, interactive, batch")
        args.priority = data["priority"]
    if data.get("deadline_ms") is not None:
        args.deadline_ms = check_deadline_ms(data["deadline_ms"], "deadline_ms")
    return args


def _logit_bias(bias: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``logit_bias``: {"token id": bias from -100 to 100}, as (id, bias) pairs."""
    if not isinstance(bias, dict) or len(bias) > MAX_LOGIT_BIAS:
        raise BadInput(f'logit_bias must be an object of at most {MAX_LOGIT_BIAS} "token id": bias pairs')
    out = []
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit() and len(key) <= 10) or isinstance(value, bool) or \
                not isinstance(value, (int, float)) or not -LOGIT_BIAS <= value <= LOGIT_BIAS:
            raise BadInput(f"logit_bias {key[:20]!r}: {value!r} is not valid: keys are token ids (digits), values "
                           f"numbers from -{LOGIT_BIAS:g} to {LOGIT_BIAS:g}"[:200])
        out.append((int(key), float(value)))
    return tuple(sorted(out))


def _chat_logprobs(data: dict[str, Any]) -> int | None:
    """Chat's ``logprobs`` (true/false) and ``top_logprobs`` (0-20, with logprobs) as the alternatives to report."""
    wanted, top = data.get("logprobs"), data.get("top_logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise BadInput(f"logprobs must be true or false, got {wanted!r}"[:200])
    if top is not None:
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise BadInput(f"top_logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {top!r}"[:200])
        if not wanted and top:
            raise BadInput("top_logprobs needs logprobs: true")
    return (top or 0) if wanted else None


def _completion_logprobs(data: dict[str, Any]) -> int | None:
    """Completions' ``logprobs``: the number of alternatives to report (0-5), or null for none."""
    n = data.get("logprobs")
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 5:
        raise BadInput(f"logprobs must be an integer from 0 to 5 (the alternatives per token) or null, got {n!r}"[:200])
    return n


def check_deadline_ms(value: Any, where: str) -> int:
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit() and len(value.strip()) <= 12:
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 86_400_000:
        raise BadInput(f"{where} must be an integer number of milliseconds from 1 to 86400000, got {value!r}"[:200])
    return value


def _content(i: int, content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise BadInput(f"messages[{i}].content: only text parts ({{\"type\": \"text\", \"text\": ...}}) are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise BadInput(f"messages[{i}].content must be text or a list of text parts, got {type(content).__name__}")


def _messages_error(text: str) -> BadInput:
    exc = BadInput(text)
    exc.param = "messages"  # type: ignore[attr-defined]  # OpenAI's error names the field
    return exc


def _tool_calls(i: int, calls: Any) -> list[ToolCall]:
    """An assistant message's ``tool_calls`` (OpenAI's shape: id, type function, name, arguments as JSON text)."""
    where = f"messages[{i}].tool_calls"
    if not isinstance(calls, list):
        raise _messages_error(f"{where} must be a list of calls")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or call.get("type", "function") != "function":
            raise _messages_error(f'{where}[{j}] must be {{"id", "type": "function", "function": {{"name", "arguments"}}}}')
        name, arguments, cid = fn.get("name"), fn.get("arguments"), call.get("id", "")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise _messages_error(f"{where}[{j}].function.name must be 1-64 of a-z A-Z 0-9 _ -")
        if isinstance(arguments, dict):  # some clients send the object itself
            arguments = json.dumps(arguments, ensure_ascii=False)
        try:
            ok = isinstance(arguments, str) and isinstance(json.loads(arguments), dict)
        except (ValueError, RecursionError):
            ok = False
        if not ok:
            raise _messages_error(f"{where}[{j}].function.arguments must be a JSON object, as text")
        if not isinstance(cid, str) or len(cid) > 256:
            raise _messages_error(f"{where}[{j}].id must be text of at most 256 characters")
        out.append(ToolCall(cid, name, arguments))
    return out


def parse_chat(data: dict[str, Any], max_tokens_cap: int) -> GenArgs:
    args = _common(data, max_tokens_cap)
    top = _chat_logprobs(data)
    if top is not None:
        args.sampling["top_logprobs"] = top
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadInput("messages must be a non-empty list of {\"role\", \"content\"} objects")
    if len(messages) > MAX_MESSAGES:  # before any work per message: fitting a chat renders and tokenizes each one
        raise _messages_error(f"messages: {len(messages)} messages; at most {MAX_MESSAGES} are accepted")
    args.tools = Tools.parse(data.get("tools"), data.get("tool_choice"), data.get("parallel_tool_calls"))
    if args.tools is not None and args.tools.calls and "grammar" in args.sampling:
        raise BadInput("tools and response_format (or grammar) both constrain the answer: give one of them")
    out: list[dict[str, Any]] = []
    tooled = args.tools is not None
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise BadInput(f"messages[{i}] must be an object with role and content")
        role = "system" if msg.get("role") == "developer" else msg.get("role")
        if role not in (*ROLES, "tool"):
            raise BadInput(f"messages[{i}].role {msg.get('role')!r} is not valid: use {', '.join(ROLES)}, tool"[:200])
        calls = msg.get("tool_calls")
        content = msg.get("content")
        if role == "assistant" and calls:
            out.append({"role": role, "content": "" if content is None else _content(i, content),
                        "tool_calls": _tool_calls(i, calls)})
            tooled = True
            continue
        entry: dict[str, Any] = {"role": role, "content": _content(i, content)}
        if role == "tool":
            cid = msg.get("tool_call_id")
            if not isinstance(cid, str):
                raise _messages_error(f"messages[{i}].tool_call_id must name the call this result answers")
            entry["tool_call_id"] = cid
            tooled = True
        out.append(entry)
    if out[-1]["role"] not in ("user", "tool"):
        raise BadInput("the last message must come from the user (or be a tool's result)")
    chars = sum(len(m["content"]) for m in out)
    if chars > MAX_CHAT_CHARS:
        raise _messages_error(f"messages: {chars} characters of content; at most {MAX_CHAT_CHARS} are accepted")
    args.messages = out
    args.tooled = tooled
    return args


def parse_completion(data: dict[str, Any], max_tokens_cap: int) -> GenArgs:
    args = _common(data, max_tokens_cap)
    top = _completion_logprobs(data)
    if top is not None:
        args.sampling["top_logprobs"] = top
    prompt = data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise BadInput("prompt must be a non-empty string (or a list of one string)")
    if data.get("suffix"):
        raise BadInput("suffix is not supported")
    args.prompt = prompt
    return args


# -- responses -------------------------------------------------------------------------
FINISH = {"eos": "stop", "stop": "stop", "length": "length"}


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def dropped(truncations: list[Truncation]) -> tuple[int, int]:
    return sum(t.tokens_dropped for t in truncations), sum(t.messages_dropped for t in truncations)


def truncated_header(truncations: list[Truncation]) -> dict[str, str]:
    """``X-Edgerun-Truncated: tokens=N, messages=M`` when anything was dropped, else no header."""
    if not truncations:
        return {}
    tokens, messages = dropped(truncations)
    return {"X-Edgerun-Truncated": f"tokens={tokens}, messages={messages}"}


def usage(result: Result) -> dict[str, Any]:
    out: dict[str, Any] = {"prompt_tokens": result.tokens_in, "completion_tokens": result.tokens_out,
                           "total_tokens": result.tokens_in + result.tokens_out}
    if result.truncations:
        tokens, messages = dropped(result.truncations)
        out["truncated"] = {"tokens_dropped": tokens, "messages_dropped": messages,
                            "events": [{"kind": t.kind, "tokens_dropped": t.tokens_dropped, "at_token": t.at_token,
                                        "messages_dropped": t.messages_dropped} for t in result.truncations]}
    return out


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


@dataclass
class Reply:
    """One answer's shape: its id, creation time, model and fingerprint are the same in every chunk of a stream.
    ``fingerprint``: the version that answered (OpenAI's ``system_fingerprint``: with a ``seed``, a change of it
    says the answer may differ). ``tools``: a chat's tools; when calls are allowed, the answer is read for them
    (runtime.llm.tools.CallReader) and calls go out as ``tool_calls``, whole or streamed."""

    chat: bool
    id: str
    model: str
    fingerprint: str | None = None
    tools: Tools | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    _reader: CallReader | None = field(default=None, repr=False)
    _held: list[TokenLogprob] = field(default_factory=list, repr=False)  # logprobs waiting for a chunk to carry them
    _offset: int = 0  # completions' text_offset of the next token

    def logprobs(self, entries: list[TokenLogprob] | None) -> dict[str, Any] | None:
        """``entries`` in the endpoint's shape: chat's ``content`` list, or completions' four parallel lists."""
        if entries is None:
            return None
        if self.chat:
            return {"content": [{"token": e.text, "logprob": e.logprob, "bytes": list(e.bytes),
                                 "top_logprobs": [{"token": text, "logprob": lp, "bytes": list(text.encode())}
                                                  for _, text, lp in e.top]} for e in entries], "refusal": None}
        offsets = []
        for e in entries:
            offsets.append(self._offset)
            self._offset += len(e.text)
        return {"tokens": [e.text for e in entries], "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": [{text: lp for _, text, lp in e.top} for e in entries], "text_offset": offsets}

    def _head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "system_fingerprint": self.fingerprint}

    def _reads_calls(self) -> bool:
        return self.chat and self.tools is not None and self.tools.calls

    def completion(self, text: str, result: Result) -> dict[str, Any]:
        reason = FINISH.get(result.stop_reason, "stop")
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if self._reads_calls():
                assert self.tools is not None
                reader = CallReader(self.tools, new_call_id)
                shown = reader.feed(text)[0] + reader.finish()[0]
                if reader.calls:
                    message = {"role": "assistant", "content": shown or None,
                               "tool_calls": [{"id": c.id, "type": "function",
                                               "function": {"name": c.name, "arguments": c.arguments}}
                                              for c in reader.calls]}
                    reason = "tool_calls" if reason == "stop" else reason
            choice = {"index": 0, "message": message, "logprobs": self.logprobs(result.logprobs), "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": self.logprobs(result.logprobs), "finish_reason": reason}
        return {**self._head("chat.completion" if self.chat else "text_completion"), "choices": [choice],
                "usage": usage(result)}

    def chunk(self, text: str | None, finish: str | None = None, first: bool = False) -> dict[str, Any]:
        """A chunk of ``text``; it carries the log probabilities held for it (those of the tokens sent so far)."""
        held, self._held = (self._held, []) if (text or finish) and self._held else (None, self._held)
        lp = self.logprobs(held) if held else None
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": text or ""} if first else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": lp, "finish_reason": finish}
        return {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [choice]}

    def pieces(self, text: str, end: bool = False, logprobs: list[TokenLogprob] | None = None) -> list[dict[str, Any]]:
        """The chunks that stream ``text``, the answer's next piece (``end``: the last; text held back while it
        could still be a call comes out then), with ``logprobs``, its tokens' log probabilities. Calls stream as
        OpenAI streams them: a call's first chunk has its index, id, type and name, the next ones fragments of its
        arguments."""
        if logprobs:
            self._held.extend(logprobs)
        if not self._reads_calls():
            return [self.chunk(text)] if text else []
        if self._reader is None:
            assert self.tools is not None
            self._reader = CallReader(self.tools, new_call_id)
        shown, deltas = self._reader.feed(text) if text else ("", [])
        if end:
            shown += self._reader.finish()[0]
        out = [self.chunk(shown)] if shown else []
        if deltas:
            merged: dict[int, dict[str, Any]] = {}
            for d in deltas:
                item = merged.setdefault(d.index, {"index": d.index})
                if d.id is not None:
                    item.update(id=d.id, type="function", function={"name": d.name, "arguments": ""})
                item.setdefault("function", {"arguments": ""})["arguments"] += d.arguments
            delta = {"tool_calls": list(merged.values())}
            out.append({**self._head("chat.completion.chunk"),
                        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]})
        return out

    def last_chunk(self, result: Result) -> dict[str, Any]:
        reason = FINISH.get(result.stop_reason, "stop")
        if reason == "stop" and self._reader is not None and self._reader.calls:
            reason = "tool_calls"
        return self.chunk(None, finish=reason)

    def usage_chunk(self, result: Result) -> dict[str, Any]:
        return {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [],
                "usage": usage(result)}


# -- errors ----------------------------------------------------------------------------
def status_of(exc: BaseException) -> tuple[int, str, str | None]:
    """(HTTP status, OpenAI error type, code) for an exception."""
    if isinstance(exc, BodyTooLarge):
        return 413, "invalid_request_error", "request_too_large"
    if isinstance(exc, Unauthorized):
        return 401, "authentication_error", "invalid_api_key"
    if isinstance(exc, Forbidden):
        return 403, "permission_error", "forbidden"
    if isinstance(exc, UnknownModel):
        return 404, "invalid_request_error", "model_not_found"
    if isinstance(exc, Blocked):
        return 400, "invalid_request_error", "content_filter"
    if isinstance(exc, BadInput):
        return 400, "invalid_request_error", None
    if isinstance(exc, QueueFull):
        return 429, "rate_limit_error", "queue_full"
    if isinstance(exc, DeadlineExceeded):
        return 504, "timeout_error", "deadline_exceeded"
    if isinstance(exc, ShuttingDown):
        return 503, "server_error", "shutting_down"
    if isinstance(exc, (NotReady, DoesNotFit)):
        return 503, "server_error", "not_ready" if isinstance(exc, NotReady) else "does_not_fit"
    if isinstance(exc, Cancelled):
        return 499, "cancelled", "cancelled"
    return 500, "server_error", None


def error_body(exc: BaseException) -> dict[str, Any]:
    _, kind, code = status_of(exc)
    message = one_line(exc) if isinstance(exc, EdgerunError) else "internal error (see the server log)"
    return {"error": {"message": message, "type": kind, "param": getattr(exc, "param", None), "code": code}}


def error_response(exc: BaseException) -> JSONResponse:
    status = status_of(exc)[0]
    headers = {}
    if isinstance(exc, QueueFull):
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))  # whole seconds, rounded up, at least 1
    if isinstance(exc, Unauthorized):
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(error_body(exc), status_code=status, headers=headers)
