"""Tool calls: a tool list becomes part of the prompt and a grammar, and the answer is read back as calls.

A request with tools (:class:`Tools`) is decoded under a grammar (runtime/llm/grammar.py) that admits, by its
``choice``:

- ``auto``: plain text, or a call block whose every call names one of the tools and whose arguments validate
  against that tool's ``parameters`` schema (runtime/llm/json_schema.py);
- ``required``: only a call block; a tool's name: only one call, of that tool;
- ``none``: anything (no grammar; the answer is text and is never read as calls).

**The format.** Neither shipped model's chat template knows tools (SmolLM2's renders roles and content only;
Gemma 3 270M is a base model without one), so tools use one documented format, in the style SmolLM2 and Hermes
were trained on, carried inside ordinary messages that the model's own template then renders:

- the tool list, with how to call, is appended to the system message (one is added when there is none)::

      <tools>[{"name": "HassTurnOn", "description": "...", "parameters": {...}}, ...]</tools>

- a call, the model's and the history's alike, is the assistant's whole answer::

      <tool_call>[
      {"name": "HassTurnOn", "arguments": {"name": "Kitchen Lights"}}
      ]</tool_call>

  several calls share the one list, one per line, when ``parallel`` (at most :data:`MAX_PARALLEL`);
- tool results (``role: tool``) become one user message of ``<tool_response>`` blocks, each
  ``{"name": ..., "content": ...}`` on its own line (the content as JSON when it is JSON, else as a string).

**Markers are control text.** The markers are plain text in these vocabularies, so they are kept out of what
clients send instead: every marker-like run (``<tool_call>``, ``</tool_response>``, ``<tools>``, any case, any
spacing) in message content, tool descriptions, schemas and call arguments gets a zero-width space after its
``<`` (:func:`defang`). The model then never reads a marker that edgerun did not write, so a tool result or a user
message cannot fake a call, a result or a tool list; and the answer is read as calls only when the grammar's call
branch was taken (it starts with the marker), never because text mentions one. All of it is message content, so
none of it can become the template's control tokens either (runtime/llm/chat_tokens.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from runtime.errors import BadInput
from runtime.llm.grammar import Grammar, literal
from runtime.llm.json_schema import SchemaRules

__all__ = ["CALL_CLOSE", "CALL_OPEN", "MAX_PARALLEL", "MAX_TOOLS", "CallDelta", "CallReader", "Choice", "Tool",
           "ToolCall", "ToolFormat", "Tools", "defang", "prepare", "template_messages", "tool_format", "tool_messages"]

MAX_TOOLS = 128  # OpenAI's own limit on a request's tools
MAX_PARALLEL = 8  # calls in one answer
MAX_DESCRIPTION = 4096  # characters of one tool's description
# In arguments, where a tool's schema sets no maximum: a string's characters and an array's items (an array of enum
# values: at most as many as the enum has). Home Assistant's schemas set none; greedy, a small model then loops
# inside a name or a list until max_tokens cuts the call (uncapped: 20 of 74 calls cut at Home Assistant's 150
# tokens on SmolLM2-135M; 64 characters and 8 items: 2). The arguments still validate, and a call ends within a
# small budget: Home Assistant's names (a few words) and lists (a domain or two) are far shorter.
ARG_MAX_STRING = 48
ARG_MAX_ITEMS = 4
NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's rule for a function's name
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
TOOLS_OPEN, TOOLS_CLOSE = "<tools>", "</tools>"
_MARKER = re.compile(r"<(?=\s*/?\s*(?:tool_call|tool_response|tools)\b)", re.IGNORECASE)
_ZWSP = "\u200b"
_NAME, _ARGS = '{"name": "', '", "arguments": '  # a call's fixed head, around the tool's name


def defang(text: str) -> str:
    """``text`` with every marker-like run broken by a zero-width space after its ``<``: still readable, never a
    marker."""
    return _MARKER.sub("<" + _ZWSP, text)


class ToolFormat(StrEnum):
    """How a model's prompt carries tools and its answer writes calls."""

    EDGERUN = "edgerun"  # the format above, inside ordinary messages: any chat template
    HERMES = "hermes"  # the GGUF's own template renders the tools; a call is <tool_call>\n{...}\n</tool_call>


def tool_format(template: str | None) -> ToolFormat:
    """HERMES for a chat template that renders a ``tools`` list itself and writes calls as ``<tool_call>`` blocks
    (Qwen 2.5, Hermes, SmolLM3 and their kin), else EDGERUN (a template without tools: both shipped models)."""
    from runtime.llm.chat_template import renders_tools

    if template and CALL_OPEN in template and renders_tools(template):
        return ToolFormat.HERMES
    return ToolFormat.EDGERUN


class Choice(StrEnum):
    NONE = "none"
    AUTO = "auto"
    REQUIRED = "required"


@dataclass(frozen=True)
class Tool:
    """A function the model may call: its name, what it does, and a JSON Schema (an object) of its arguments."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    @classmethod
    def parse(cls, obj: Any, where: str) -> Tool:
        """A tool as OpenAI and Ollama send it: ``{"type": "function", "function": {"name", "description",
        "parameters"}}``; BadInput naming ``where`` otherwise."""
        if not isinstance(obj, dict) or obj.get("type", "function") != "function" or not isinstance(obj.get("function"), dict):
            raise BadInput(f'{where} must be {{"type": "function", "function": {{"name": ..., "parameters": ...}}}}')
        fn = obj["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise BadInput(f"{where}.function.name must be 1-64 of a-z A-Z 0-9 _ -, got {name!r}"[:200])
        description = fn.get("description") or ""
        if not isinstance(description, str) or len(description) > MAX_DESCRIPTION:
            raise BadInput(f"{where}.function.description must be text of at most {MAX_DESCRIPTION} characters")
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        if not isinstance(params, dict) or params.get("type", "object") != "object":
            raise BadInput(f'{where}.function.parameters must be a JSON Schema of an object ({{"type": "object", ...}})')
        params = {"type": "object", **params}  # arguments are always an object, even where the schema leaves it out
        return cls(name, description, params)

    def line(self) -> str:
        """The tool as the prompt lists it: one JSON line, client text defanged."""
        return defang(json.dumps({"name": self.name, "description": self.description, "parameters": self.parameters},
                                 ensure_ascii=False))


@dataclass(frozen=True)
class ToolCall:
    """A call: in an answer (``id`` given by the server) or in the history. ``arguments``: JSON text of an object."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Tools:
    """A request's tools and how it may call them: ``choice`` is a :class:`Choice` value or one tool's name."""

    tools: tuple[Tool, ...]
    choice: str = Choice.AUTO
    parallel: bool = True

    @classmethod
    def parse(cls, tools: Any, choice: Any = None, parallel: Any = None, where: str = "tools") -> Tools | None:
        """``tools``, ``tool_choice`` and ``parallel_tool_calls`` as OpenAI defines them (None when there are no
        tools and none is asked for); BadInput naming the field otherwise."""
        if parallel is not None and not isinstance(parallel, bool):
            raise BadInput("parallel_tool_calls must be true or false")
        if tools is None or tools == []:
            if choice in (None, Choice.NONE, Choice.AUTO):
                return None
            raise BadInput(f"tool_choice {choice!r} needs tools: give the tools it may call"[:200])
        if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
            raise BadInput(f"{where} must be a list of at most {MAX_TOOLS} tools")
        parsed = tuple(Tool.parse(t, f"{where}[{i}]") for i, t in enumerate(tools))
        names = [t.name for t in parsed]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise BadInput(f"{where}: the name {dup!r} is given to two tools")
        if choice is None:
            choice = Choice.AUTO
        elif isinstance(choice, dict):
            fn = choice.get("function")
            name = fn.get("name") if isinstance(fn, dict) else None
            if choice.get("type") != "function" or not isinstance(name, str):
                raise BadInput('tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}')
            if name not in names:
                raise BadInput(f"tool_choice names {name[:64]!r}, which is not one of the tools: {', '.join(names)}"[:300])
            choice = name
        elif choice not in tuple(Choice):
            raise BadInput('tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}')
        out = cls(parsed, str(choice), True if parallel is None else parallel)
        out.grammar()  # every schema converted now: what cannot be enforced is refused with the request
        return out

    @property
    def calls(self) -> bool:
        """Whether the answer may be calls (and is read for them)."""
        return self.choice != Choice.NONE

    def callable(self) -> tuple[tuple[int, Tool], ...]:
        """(index in the request, tool) of the tools the answer may call."""
        if self.choice in (Choice.AUTO, Choice.REQUIRED):
            return tuple(enumerate(self.tools))
        return tuple((i, t) for i, t in enumerate(self.tools) if t.name == self.choice)

    def grammar(self, fmt: ToolFormat = ToolFormat.EDGERUN) -> Grammar | None:
        """The grammar of the answers ``choice`` allows in ``fmt`` (None for ``none``), built once per format."""
        if not self.calls:
            return None
        built = self.__dict__.setdefault("_grammars", {})  # frozen: a cache beside the fields
        if fmt not in built:
            built[fmt] = _grammar(self, fmt)
        return built[fmt]

    def specs(self) -> list[dict[str, Any]]:
        """The tools as a template renders them (OpenAI's shape), client text defanged."""
        return [{"type": "function", "function": json.loads(t.line())} for t in self.tools]

    def instructions(self) -> str:
        """The system prompt's tool section (the format above, worded as SmolLM2's tool training data words it)."""
        listed = "[" + ", ".join(t.line() for t in self.tools) + "]"
        if self.choice == Choice.AUTO:
            task = ("Based on the question, call functions if they serve its purpose; if none of them can be used, "
                    "answer in plain text instead.")
        elif self.choice == Choice.REQUIRED:
            task = "Based on the question, you must call functions to achieve its purpose."
        else:
            task = f"Based on the question, you must call the function {self.choice}."
        count = "one or more calls, in the one list" if self.parallel and self.choice in tuple(Choice) else "exactly one call"
        # what depends on the choice comes last: requests with the same tools share the rest as a cached prefix
        return (f"You are given a question and a set of possible functions.\n"
                f"You have access to the following tools:\n{TOOLS_OPEN}{listed}{TOOLS_CLOSE}\n"
                f"To call functions, the output must be in this format, and no other text:\n"
                f'{CALL_OPEN}[\n{_NAME}func_name1{_ARGS}{{"argument1": "value1", "argument2": "value2"}}}}\n]{CALL_CLOSE}\n'
                f"{task} Make {count}.")


def _grammar(tools: Tools, fmt: ToolFormat) -> Grammar:
    rules = SchemaRules(max_string=ARG_MAX_STRING, max_items=ARG_MAX_ITEMS)
    alts = []
    for i, tool in tools.callable():
        args = rules.add(tool.parameters, f"tools[{i}].function.parameters")
        head = literal(_NAME + tool.name + _ARGS)
        alts.append(f'{head} {args} "}}"')
    more = f' ( ",\\n" call ){{0,{MAX_PARALLEL - 1}}}' if tools.parallel and tools.choice in tuple(Choice) else ""
    if fmt == ToolFormat.HERMES:  # one block per call, a newline between blocks
        block = f'{literal(CALL_OPEN + chr(10))} call {literal(chr(10) + CALL_CLOSE)}'
        more = more.replace('",\\n" call', f'"\\n" {block}')
        own = {"calls": f"{block}{more}", "call": " | ".join(alts)}
    else:
        start, end = literal(CALL_OPEN + "[\n"), literal("\n]" + CALL_CLOSE)
        own = {"calls": f"{start} call{more} {end}", "call": " | ".join(alts)}
    if tools.choice == Choice.AUTO:
        own["text"] = _not_starting_with(CALL_OPEN)
        own["any"] = r"[^\x00]"
        root = "calls | text"
    else:
        root = "calls"
    return rules.grammar(root, "the tools (as a grammar)", own)


def _not_starting_with(marker: str) -> str:
    """GBNF for any text (the empty one too) that does not start with ``marker``."""
    alts = ['""']
    for i, ch in enumerate(marker):
        prefix = literal(marker[:i]) + " " if i else ""
        other = "\\" + ch if ch in "^-]\\" else ch
        alts.append(f"{prefix}[^{other}] any*")
        if i:
            alts.append(literal(marker[:i]))
    return " | ".join(alts)


def tool_messages(messages: Sequence[dict[str, Any]], tools: Tools | None) -> list[dict[str, str]]:
    """``messages`` (roles system, user, assistant and tool; an assistant's ``tool_calls`` a list of
    :class:`ToolCall`, a tool message's ``tool_call_id``) as the plain messages a chat template renders, in the
    format above; the tool list in the system message when calls are allowed."""
    out: list[dict[str, str]] = []
    names: dict[str, str] = {}
    results = False  # the last message out is a user message of tool results
    for msg in messages:
        role, content = msg["role"], defang(msg.get("content") or "")
        if role == "tool":
            name = names.get(msg.get("tool_call_id") or "", msg.get("name") or "")
            try:
                value = json.loads(content)
            except ValueError:
                value = content
            block = f"{RESPONSE_OPEN}\n{json.dumps({'name': name, 'content': value}, ensure_ascii=False)}\n{RESPONSE_CLOSE}"
            if results:
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block})
                results = True
            continue
        results = False
        calls: Sequence[ToolCall] = msg.get("tool_calls") or ()
        if role == "assistant" and calls:
            listed = ",\n".join(_NAME + c.name + _ARGS + defang(_compact(c.arguments)) + "}" for c in calls)
            names.update((c.id, c.name) for c in calls)
            content = (content + "\n" if content else "") + f"{CALL_OPEN}[\n{listed}\n]{CALL_CLOSE}"
        out.append({"role": role, "content": content})
    if tools is not None and tools.calls:
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{tools.instructions()}".lstrip()}
        else:
            out.insert(0, {"role": "system", "content": tools.instructions()})
    return out


def template_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` as a template that renders tools reads them (HERMES): content defanged, an assistant's calls as
    ``tool_calls`` of ``{"id", "type": "function", "function": {"name", "arguments": object}}``, tool results as
    ``role: tool`` with the name of the call they answer."""
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for msg in messages:
        entry: dict[str, Any] = {"role": msg["role"], "content": defang(msg.get("content") or "")}
        calls: Sequence[ToolCall] = msg.get("tool_calls") or ()
        if msg["role"] == "assistant" and calls:
            entry["tool_calls"] = [{"id": c.id, "type": "function",
                                    "function": {"name": c.name, "arguments": json.loads(defang(_compact(c.arguments)))}}
                                   for c in calls]
            names.update((c.id, c.name) for c in calls)
        if msg["role"] == "tool":
            entry["tool_call_id"] = msg.get("tool_call_id") or ""
            entry["name"] = names.get(entry["tool_call_id"], msg.get("name") or "")
        out.append(entry)
    return out


def prepare(messages: Sequence[dict[str, Any]], tools: Tools | None,
            fmt: ToolFormat) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(the messages to render, the tool list the template renders itself or None) for a chat with tools or tool
    history, in the model's format."""
    if fmt == ToolFormat.HERMES:
        return template_messages(messages), (tools.specs() if tools is not None and tools.calls else None)
    return tool_messages(messages, tools), None


def _compact(arguments: str) -> str:
    return json.dumps(json.loads(arguments), ensure_ascii=False)


@dataclass
class CallDelta:
    """A piece of an answer's calls as OpenAI streams them: the first of a call carries its ``id`` and ``name``,
    the others fragments of its ``arguments``."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


class CallReader:
    """Reads a tools request's answer as it streams: text (under ``auto``, once it cannot be a call) or calls.

    ``feed`` returns (text to show, call deltas); the grammar guarantees the shape, so the reader only follows it:
    ``<tool_call>[`` then calls of ``{"name": "N", "arguments": {...}}`` joined by ``, `` then ``]</tool_call>``.
    ``new_id``: the id a new call gets ("call_" + random hex on the server).
    """

    def __init__(self, tools: Tools, new_id: Callable[[], str]) -> None:
        self.new_id = new_id
        self.mode = "?" if tools.calls else "text"
        self.buf = ""  # the answer so far, in calls mode
        self.pos = 0  # how far the calls have been read
        self.state = "open"
        self.depth = 0
        self.in_string = self.escaped = False
        self.calls: list[ToolCall] = []
        self._args: list[str] = []

    def feed(self, text: str) -> tuple[str, list[CallDelta]]:
        if self.mode == "text":
            return text, []
        self.buf += text
        if self.mode == "?":
            if self.buf.startswith(CALL_OPEN):
                self.mode, self.pos = "calls", len(CALL_OPEN)
            elif CALL_OPEN.startswith(self.buf):
                return "", []
            else:
                self.mode = "text"
                shown, self.buf = self.buf, ""
                return shown, []
        return "", self._read()

    def finish(self) -> tuple[str, list[CallDelta]]:
        """What is left at the end: text held back while it could still have been a call."""
        if self.mode == "?":
            self.mode = "text"
            shown, self.buf = self.buf, ""
            return shown, []
        return "", []

    def _read(self) -> list[CallDelta]:
        out: list[CallDelta] = []
        buf = self.buf
        while self.pos < len(buf):
            if self.state == "open":  # "[\n" before the first call, ",\n" between calls, "\n]" after the last
                ch = buf[self.pos]
                if ch == "]":
                    self.state, self.pos = "done", len(buf)
                    break
                if ch == "{":
                    self.state = "head"
                else:
                    self.pos += 1
            elif self.state == "head":  # {"name": "N", "arguments": (a name holds no quote)
                end = buf.find(_ARGS, self.pos + len(_NAME))
                if end < 0:
                    break
                call = ToolCall(self.new_id(), buf[self.pos + len(_NAME) : end], "")
                self.pos = end + len(_ARGS)
                self.calls.append(call)
                self._args.append("")
                out.append(CallDelta(len(self.calls) - 1, call.id, call.name))
                self.state, self.depth = "args", 0
            elif self.state == "args":
                start = self.pos
                while self.pos < len(buf):
                    ch = buf[self.pos]
                    self.pos += 1
                    if self.in_string:
                        if self.escaped:
                            self.escaped = False
                        elif ch == "\\":
                            self.escaped = True
                        elif ch == '"':
                            self.in_string = False
                    elif ch == '"':
                        self.in_string = True
                    elif ch in "{[":
                        self.depth += 1
                    elif ch in "}]":
                        self.depth -= 1
                        if self.depth == 0:
                            self.state = "tail"
                            break
                frag = buf[start : self.pos]
                if frag:
                    i = len(self.calls) - 1
                    self._args[i] += frag
                    self.calls[i] = ToolCall(self.calls[i].id, self.calls[i].name, self._args[i])
                    out.append(CallDelta(i, arguments=frag))
            elif self.state == "tail":  # the args' trailing whitespace, then the call's '}'
                close = buf.find("}", self.pos)
                if close < 0:
                    break
                self.pos, self.state = close + 1, "open"
            else:
                self.pos = len(buf)
        return out
