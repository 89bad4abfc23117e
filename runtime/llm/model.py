"""The LLM API: load a model within a memory budget, generate and chat, streaming.

    with LLM.load("default", memory="512M") as llm:
        for piece in llm.stream("Why is the sky blue?"):
            print(piece, end="", flush=True)
        result = llm.generate("Hello", SamplingParams(max_tokens=32))

Loading resolves the model (bundle, .gguf, name), reads and checks its GGUF
header, plans memory (refusing before allocating if it cannot fit), resolves
the placement (target and threads) and only then opens the backend.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from runtime.backends.base import LLMBackend
from runtime.bundle.resolve import ResolvedModel
from runtime.errors import BadInput
from runtime.llm.decoding import Decoding, Result, Truncation
from runtime.llm.generation import Generation
from runtime.llm.kv import KVSequence
from runtime.llm.language_model import LanguageModel
from runtime.llm.loader import open_llm
from runtime.llm.plan import KVType, MemoryPlan
from runtime.llm.prefix_cache import PrefixCache
from runtime.llm.sampling import SamplingParams
from runtime.llm.speculative import K_MAX, PromptLookup, Speculator
from runtime.llm.tools import Tools

__all__ = ["LLM", "Generation", "Result", "Truncation"]

log = logging.getLogger(__name__)


class LLM(LanguageModel):
    """A loaded language model, one generation at a time in the caller's thread (the serving engine,
    runtime/serving/engine.py, serves many). Close it (or use ``with``) to free native memory."""

    def __init__(self, model: ResolvedModel, plan: MemoryPlan, backend: LLMBackend, placement: Any, *,
                 speculate: bool = True) -> None:
        """Takes ownership of ``backend``: it is closed here if the model cannot be set up.

        ``speculate``: speculative decoding (runtime/llm/speculative.py) where the backend can verify drafts: prompt
        lookup drafts, verified in one batch, adaptive (off by itself when it does not pay). Assign
        :attr:`speculator` to draft otherwise (a draft model); None turns it off."""
        self.model = model
        self.plan = plan
        self.backend = backend
        self.placement = placement
        self.draft: Any = None  # a runtime.llm.draft.DraftModel when loaded with one (LLM.load(draft=...))
        self.speculator: Speculator | None = (
            Speculator(PromptLookup()) if speculate and backend.can_speculate else None
        )
        self.max_draft = K_MAX
        try:
            self._cap_drafts()
            # a sliding-window cache keeps shorter entries: its loaded states cannot be cut short exactly
            self.prefix_cache = PrefixCache(plan.prefix_cache_bytes, supersede=not plan.kv_swa_bytes)
            self.kv = KVSequence(backend, self.prefix_cache)
            spec = model.manifest.llm
            if spec is None:
                raise BadInput(f"{model.manifest.ref} has no llm section in its manifest")
            self.defaults = SamplingParams.from_defaults(spec.sampling)
        except BaseException:
            backend.close()
            raise

    def _cap_drafts(self) -> None:
        """Set :attr:`max_draft`, the longest draft whose verify batch computes what single steps compute
        (runtime.llm.generation caps every draft at it, so greedy output stays plain decoding's): measured once by the
        backend, only for a model that speculates."""
        if self.speculator is None or not hasattr(self.backend, "exact_batch"):
            return
        self.max_draft = self.backend.exact_batch(K_MAX + 1) - 1
        if self.max_draft < K_MAX:
            log.info("verify batches of more than %d tokens compute other logits than single steps on this model and"
                     " build: drafts are capped at %d", self.max_draft + 1, self.max_draft)
        if self.max_draft < 1:
            self.speculator = None
        else:
            self.speculator.controller.k_max = min(self.speculator.controller.k_max, self.max_draft)

    @property
    def n_ctx(self) -> int:
        return self.backend.n_ctx

    @classmethod
    def load(
        cls,
        model: str | ResolvedModel,
        *,
        memory: int | str | None = None,
        ctx: int | None = None,
        kv_type: KVType | str | None = None,
        threads: int | None = None,
        target: str = "auto",
        require_accelerator: bool = False,
        prefix_cache_bytes: int | None = None,
        speculate: bool = True,
        draft: str | ResolvedModel | None = None,
    ) -> LLM:
        """``draft``: a draft model (runtime/llm/draft.py; bundle, .gguf or name) that drafts instead of prompt lookup,
        planned with the target (its own terms) and checked to share its vocabulary; without it, the bundle's own
        (manifest ``llm.draft``) when it has one and ``speculate`` is on."""
        if draft is not None and not speculate:
            raise BadInput("--draft gives a draft model for speculative decoding, which --no-speculate turns off: give one of them")
        opened = open_llm(model, memory=memory, ctx=ctx, kv_type=kv_type, threads=threads, target=target,
                          require_accelerator=require_accelerator, prefix_cache_bytes=prefix_cache_bytes, draft=draft,
                          bundle_draft=speculate)
        try:
            llm = cls(opened.model, opened.plan, opened.backend, opened.placement, speculate=speculate)
        except BaseException:
            if opened.draft is not None:
                opened.draft.close()
            raise
        if opened.draft is not None:  # (S2, draft model) the LLM owns it: closed with it
            if llm.speculator is None:  # this backend cannot verify drafts
                opened.draft.close()
                log.warning("%s cannot verify drafts here: the draft model %s is not used", llm.model.manifest.ref,
                            opened.draft.ref)
            else:
                llm.draft = opened.draft
                llm.speculator = Speculator(opened.draft)
        return llm

    def close(self) -> None:
        self.backend.close()
        if self.draft is not None:
            self.draft.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- generation ----------------------------------------------------------------
    def start(self, prompt: str | Sequence[int], params: SamplingParams | None = None, *, n_keep: int | None = None,
              truncations: Sequence[Truncation] = (), speculate: bool = True) -> Generation:
        """A generation of ``prompt`` (cut to fit the context when it does not, and reported); ``speculate`` False
        decodes it plainly even when the LLM speculates."""
        if isinstance(prompt, str):
            if not prompt:
                raise BadInput("--prompt is empty: give some text to continue")
            tokens = self.tokenize(prompt)
        else:
            tokens = list(prompt)
        seq = Decoding(tokens, self.check_params(params or self.defaults), self.n_ctx, n_keep=n_keep, truncate=True,
                       truncations=truncations, speculator=self.speculator if speculate else None)
        return Generation(seq, self.backend, self.kv, self.plan.kv_type.value, self.max_draft)

    def generate(self, prompt: str | Sequence[int], params: SamplingParams | None = None) -> Result:
        return self.start(prompt, params).finish()

    def stream(self, prompt: str | Sequence[int], params: SamplingParams | None = None) -> Generation:
        return self.start(prompt, params)

    def chat(self, messages: list[dict[str, Any]], params: SamplingParams | None = None, *,
             schema: Any = None, tools: Tools | None = None) -> Generation:
        """The model's answer to ``messages``; ``schema``: a JSON Schema (a dict) the answer validates against,
        enforced while decoding (runtime/llm/json_schema.py; BadInput naming what cannot be enforced); ``tools``:
        the tools it may call (runtime/llm/tools.py; read the answer with CallReader)."""
        params = params or self.defaults
        specs = None
        if tools is not None or any("tool_calls" in m or m.get("role") == "tool" for m in messages):
            messages, specs, params = self.tool_chat(messages, tools, params)
        if schema is not None:
            from runtime.llm.json_schema import schema_grammar

            params = params.with_(grammar=schema_grammar(schema, "schema"))
        prompt = self.fit_chat(messages, params, tools=specs)
        return self.start(prompt.tokens, params, n_keep=prompt.n_keep, truncations=prompt.truncations)
