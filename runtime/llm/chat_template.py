"""A model's chat template, rendered in a bounded sandbox, with message content kept apart.

The template is Jinja2 text that came with the model (``tokenizer.chat_template``):
it is treated as hostile. It runs in Jinja's immutable sandbox (no attribute
starting with ``_``, no mutation of lists and dicts), and within a budget:

- every loop iteration and every call counts as a step (at most :data:`MAX_STEPS`);
- no call or filter takes an integer argument beyond :data:`MAX_INT_ARG`;
- no string or list built by ``+``, ``*``, ``%``, ``~`` or a call grows past the text
  limit, and the strings built in one render add up to at most :data:`MAX_BUILT` times it;
- integers from ``*`` and ``**`` stay under :data:`MAX_INT_BITS` bits;
- the rendered text stays under the text limit (1 Mi characters plus 4 times the content).

Whatever goes wrong (a syntax error, a refused attribute, a budget exceeded, an
exception in the template) ends in one :class:`BadInput` line naming the template.

:meth:`ChatTemplate.render_parts` tells the template's own text from message
content, so that only the former can hold control tokens (runtime/llm/chat_tokens.py).
"""

from __future__ import annotations

import functools
import json
import re
import secrets
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from runtime.errors import BadInput, EdgerunError, missing, one_line

MAX_STEPS = 200_000  # loop iterations plus calls in one render
MAX_INT_ARG = 1_000_000  # largest integer a call or filter may be given (a width, a count, a range)
MAX_INT_BITS = 4096  # largest integer a template may compute with * or **
MAX_TEXT = 1 << 20  # characters, plus 4 times the messages' own
MAX_BUILT = 64  # the characters built in one render, in units of the text limit
_WIDE_FORMAT = re.compile(r"\d{7,}")  # a width or precision of a million or more in a format string
_ITER, _CONCAT = "__edgerun_iter", "__edgerun_concat"


class _Budget:
    def __init__(self, text_limit: int) -> None:
        self.steps = 0
        self.built = 0
        self.text_limit = text_limit

    def step(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise _Refused(f"it runs more than {MAX_STEPS} loop iterations and calls")

    def sized(self, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_INT_BITS:
            raise _Refused(f"it computes an integer of more than {MAX_INT_BITS} bits")
        if isinstance(value, (str, list, tuple)):
            if len(value) > self.text_limit:
                raise _Refused(f"it builds a {type(value).__name__} of {len(value)} items (the limit is {self.text_limit})")
            self.built += len(value)
            if self.built > MAX_BUILT * self.text_limit:
                raise _Refused(f"it builds more than {MAX_BUILT * self.text_limit} characters in all")
        return value


class _Refused(Exception):
    """The template went past its budget."""


def _check_args(args: Iterable[Any]) -> None:
    for arg in args:
        if isinstance(arg, int) and not isinstance(arg, bool) and abs(arg) > MAX_INT_ARG:
            raise _Refused(f"it passes {arg} to a call (at most {MAX_INT_ARG} is allowed)")
        if isinstance(arg, (tuple, list)) and len(arg) <= 64:  # '%' formatting takes its arguments as a tuple
            _check_args(arg)


def _check_format(fmt: Any) -> None:
    if isinstance(fmt, str) and _WIDE_FORMAT.search(fmt):
        raise _Refused("it formats with a width or precision of a million or more")


@functools.cache
def _sandbox() -> type:
    try:
        from jinja2 import nodes
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from jinja2.visitor import NodeTransformer
    except ImportError:
        raise missing("jinja2", "llm") from None

    class Environment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"+", "*", "**", "%"})

        def __init__(self) -> None:
            super().__init__(trim_blocks=True, lstrip_blocks=True)
            self._local = threading.local()
            self.globals[_ITER] = self._iter
            self.globals[_CONCAT] = self._concat
            for name, func in list(self.filters.items()):
                self.filters[name] = self._bounded_filter(func, name)

        @property
        def budget(self) -> _Budget:
            return self._local.budget

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - Jinja's signature
            budget = __self.budget
            budget.step()
            _check_args(args)
            _check_args(kwargs.values())
            method = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format
            owner = getattr(method, "__self__", None)
            if isinstance(owner, str):
                name = getattr(method, "__name__", "")
                if name in ("format", "format_map"):
                    _check_format(owner)
                elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
                    # Predict the result's length before building it: replacing '' inserts at every position.
                    count = owner.count(args[0]) if args[0] else len(owner) + 1
                    if len(owner) + count * (len(args[1]) - len(args[0])) > budget.text_limit:
                        raise _Refused(f"it builds a string of more than {budget.text_limit} characters")
            return budget.sized(super().call(__context, __obj, *args, **kwargs))

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            budget = self.budget
            if operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
                if left.bit_length() * right > MAX_INT_BITS:
                    raise _Refused(f"it computes an integer of more than {MAX_INT_BITS} bits")
            if operator == "*":
                seq, n = (left, right) if isinstance(right, int) else (right, left)
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > budget.text_limit:
                    raise _Refused(f"it builds a {type(seq).__name__} of {len(seq) * n} items (the limit is {budget.text_limit})")
            if operator == "%" and isinstance(left, str):
                _check_format(left)
                _check_args(right if isinstance(right, (tuple, list)) else (right,))
            return budget.sized(super().call_binop(context, operator, left, right))

        def _iter(self, iterable: Any) -> Iterator[Any]:
            budget = self.budget
            for item in iterable:
                budget.step()
                yield item

        def _concat(self, parts: list[Any]) -> str:
            return self.budget.sized("".join(map(str, parts)))

        def _bounded_filter(self, func: Any, name: str) -> Any:
            @functools.wraps(func)
            def bounded(*args: Any, **kwargs: Any) -> Any:
                _check_args(args)
                _check_args(kwargs.values())
                if name == "format":  # "%9999999d"|format(1)
                    _check_format(next((a for a in args if isinstance(a, str)), None))
                return self.budget.sized(func(*args, **kwargs))

            return bounded

        def compile_bounded(self, source: str) -> Any:
            """The template, its loops counted and its ``~`` concatenations bounded."""

            class Bound(NodeTransformer):
                def visit_For(self, node: Any) -> Any:  # noqa: N802 - Jinja's visitor names
                    self.generic_visit(node)
                    node.iter = nodes.Call(nodes.Name(_ITER, "load"), [node.iter], [], None, None, lineno=node.lineno)
                    return node

                def visit_Concat(self, node: Any) -> Any:  # noqa: N802
                    self.generic_visit(node)
                    items = nodes.List(node.nodes, lineno=node.lineno)
                    return nodes.Call(nodes.Name(_CONCAT, "load"), [items], [], None, None, lineno=node.lineno)

            tree = Bound().visit(self.parse(source))
            tree.set_environment(self)
            return self.from_string(tree)

    return Environment




def renders_tools(source: str) -> bool:
    """Whether a chat template renders a tool list itself (it reads a ``tools`` variable), parsed, never run."""
    try:
        from jinja2 import Environment, meta
    except ImportError:
        raise missing("jinja2", "llm") from None
    try:
        return "tools" in meta.find_undeclared_variables(Environment().parse(source))
    except Exception:  # a template that does not parse renders nothing, tools included
        return False


class ChatTemplate:
    def __init__(self, source: str, bos: str, eos: str, name: str = "the model") -> None:
        self.name = name
        self.source = source
        self._env = _sandbox()()
        from jinja2 import TemplateSyntaxError

        try:
            self._template = self._env.compile_bounded(source)
        except TemplateSyntaxError as exc:
            raise BadInput(f"the chat template of {name} is not valid Jinja (line {exc.lineno}): {one_line(exc, 200)}") from None
        except (RecursionError, MemoryError, ValueError) as exc:
            raise BadInput(f"the chat template of {name} cannot be compiled: {one_line(exc, 200)}") from None
        self.bos, self.eos = bos, eos
        self._env.globals["raise_exception"] = self._raise_exception

    def _raise_exception(self, message: str) -> None:
        raise BadInput(f"the chat template of {self.name} refused the conversation: {one_line(Exception(message), 200)}")

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None) -> str:
        """The template over ``messages``; ``tools``: the tool list, for a template that renders one itself."""
        extra = len(json.dumps(tools)) + sum(len(json.dumps(m.get("tool_calls") or [])) for m in messages) if tools or \
            any("tool_calls" in m for m in messages) else 0
        limit = MAX_TEXT + 4 * (sum(len(m["content"]) for m in messages) + extra)
        context = {"tools": tools} if tools is not None else {}
        env = self._env
        env._local.budget = _Budget(limit)
        out: list[str] = []
        size = 0
        try:
            for piece in self._template.generate(
                messages=messages, add_generation_prompt=add_generation_prompt, bos_token=self.bos, eos_token=self.eos,
                **context,
            ):
                size += len(piece)
                if size > limit:
                    raise _Refused(f"its output passes {limit} characters")
                out.append(piece)
        except EdgerunError:
            raise
        except _Refused as exc:
            raise BadInput(f"the chat template of {self.name} was stopped: {exc}") from None
        except Exception as exc:  # anything the template's own code raises (SecurityError, TypeError, ...)
            raise BadInput(f"the chat template of {self.name} failed: {type(exc).__name__}: {one_line(exc, 200)}") from None
        finally:
            env._local.budget = None
        return "".join(out)

    def render_parts(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                     tools: list[dict[str, Any]] | None = None) -> tuple[str, list[tuple[str, bool]], bool]:
        """The rendering; the same text split into (text, is_content) parts; whether the split is exact.

        Each message's content is replaced by a unique placeholder (its leading and
        trailing whitespace kept around it, so that a template that trims content still
        trims it), the template rendered again and the placeholders put back. The split
        is not exact when that does not give the rendering back: the template rewrites
        content beyond trimming it. The parts' template text is the template's own either way.
        """
        text = self.render(messages, add_generation_prompt, tools)
        tag = secrets.token_hex(8)
        slot = re.compile(f"\ue000{tag}(\\d+)\ue001")
        masked, cores = [], []
        for msg in messages:
            content = msg["content"]
            core = content.strip()
            if not core:  # nothing to keep apart; a template may test for empty content
                masked.append(msg)
                continue
            start = content.index(core)
            masked.append({**msg, "content": f"{content[:start]}\ue000{tag}{len(cores)}\ue001{content[start + len(core):]}"})
            cores.append(core)
        pieces = slot.split(self.render(masked, add_generation_prompt, tools))
        parts = [(cores[int(p)], True) if i % 2 else (p, False) for i, p in enumerate(pieces) if p]
        return text, parts, "".join(p for p, _ in parts) == text
