"""What the single-stream LLM and the serving engine share as a loaded language model: the bundle's sampling
defaults, its tokenizer, its chat template and the chat tokenizer, and a conversation's fit.

:class:`LanguageModel` is the base of both runtime.llm.model.LLM (one sequence, driven in the caller's thread) and
runtime.serving.engine.Engine (many slots, one engine thread); each gives it ``model`` (the resolved bundle),
``backend`` (its tokenizer and special tokens) and ``n_ctx`` (the context one generation gets).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from runtime.bundle.resolve import ResolvedModel
from runtime.errors import BadInput
from runtime.llm.chat import ChatPrompt, fit_chat
from runtime.llm.chat_template import ChatTemplate
from runtime.llm.chat_tokens import ChatTokenizer
from runtime.llm.sampling import SamplingParams
from runtime.llm.tools import ToolFormat, Tools, prepare, tool_format


class TextBackend(Protocol):
    """The tokenizer side of a llama.cpp backend (both the single-sequence and the batch one)."""

    def tokenize(self, text: str, *, add_bos: bool, special: bool) -> list[int]: ...

    def special_text(self, which: str) -> str: ...


class LanguageModel:
    """A loaded language model's text side. Subclasses set :attr:`model`, :attr:`backend`, :attr:`defaults` and
    give :attr:`n_ctx`."""

    model: ResolvedModel
    backend: Any  # a TextBackend (and ChatTokenizer's special tokens); the subclass's own backend type
    defaults: SamplingParams
    _chat_template: ChatTemplate | None = None
    _chat_tokenizer: ChatTokenizer | None = None

    @property
    def n_ctx(self) -> int:
        raise NotImplementedError

    def params(self, **overrides: Any) -> SamplingParams:
        """The bundle's default sampling settings with ``overrides`` (None: keep default)."""
        spec = self.model.manifest.llm
        assert spec is not None
        return SamplingParams.from_defaults(spec.sampling, **overrides)

    def check_params(self, params: SamplingParams) -> SamplingParams:
        """``params`` as a generation of this model can take them: its grammar compiled once and its logit_bias's
        tokens in the vocabulary (BadInput otherwise, before anything is queued or decoded)."""
        if params.grammar is not None:
            self.backend.check_grammar(params.grammar)
        if params.logit_bias:
            n_vocab = self.backend.n_vocab
            bad = next((t for t, _ in params.logit_bias if t >= n_vocab), None)
            if bad is not None:
                raise BadInput(f"logit_bias names token {bad}; this model's tokens are 0 to {n_vocab - 1}")
        return params

    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        return self.backend.tokenize(text, add_bos=True, special=special)

    @property
    def chat_template(self) -> ChatTemplate:
        """The model's chat template: the bundle's own, built on first use (BadInput for a base model)."""
        if self._chat_template is None:
            spec = self.model.manifest.llm
            assert spec is not None
            if not spec.chat_template:
                raise BadInput(
                    f"{self.model.manifest.ref} has no chat template (a base model); use 'edgerun run --prompt' to continue text"
                )
            bos, eos = self.backend.special_text("bos"), self.backend.special_text("eos")
            self._chat_template = ChatTemplate(spec.chat_template, bos, eos, self.model.manifest.ref)
        return self._chat_template

    @chat_template.setter
    def chat_template(self, template: ChatTemplate | None) -> None:
        """Chat with ``template`` instead of the bundle's own (None: back to the bundle's)."""
        self._chat_template = template

    @property
    def chat_tokenizer(self) -> ChatTokenizer:
        """Tokenizes rendered chats: only the template's own markers become control tokens."""
        if self._chat_tokenizer is None:
            self._chat_tokenizer = ChatTokenizer(self.backend)
        return self._chat_tokenizer

    @property
    def tool_format(self) -> ToolFormat:
        """How this model's prompt carries tools (runtime.llm.tools.tool_format of its chat template)."""
        return tool_format(self.chat_template.source)

    def fit_chat(self, messages: list[dict[str, Any]], params: SamplingParams | None = None, *,
                 interrupt: Callable[[], None] | None = None, truncate: bool = True,
                 tools: list[dict[str, Any]] | None = None) -> ChatPrompt:
        """``messages`` as this model's prompt in its context (runtime.llm.chat.fit_chat); ``tools``: the tool list
        a template that renders tools renders (runtime.llm.tools.prepare)."""
        return fit_chat(self, messages, params or self.defaults, interrupt, truncate=truncate, tools=tools)

    def tool_chat(self, messages: list[dict[str, Any]], tools: Tools | None,
                  params: SamplingParams) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, SamplingParams]:
        """A chat with ``tools`` (or tool calls and results in its history) in this model's tool format: (the
        messages to fit, the tool list its template renders or None, ``params`` with the calls' grammar)."""
        fmt = self.tool_format
        prepared, specs = prepare(messages, tools, fmt)
        if tools is not None and tools.calls:
            params = params.with_(grammar=tools.grammar(fmt))
        return prepared, specs, params
