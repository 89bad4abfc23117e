"""Continuous batching: several requests decoded together by one llama.cpp context, one engine thread.

    with Engine.load("default", memory="1G", slots=4) as engine:
        handle = engine.submit(GenRequest(engine.tokenize("Hello"), engine.params(max_tokens=32)))
        for event in handle.events():
            print(event.text, end="")

The context holds ``slots`` sequences (sequence id = slot, a KV stream of ``slot_ctx`` cells each; the planner
splits the KV budget between them). Requests wait in a :class:`~runtime.serving.scheduler.Scheduler` (priority classes,
bounded queues, aging, deadlines). Every step of the engine thread:

1. drops running requests that were cancelled or whose deadline passed (their slot is free at once);
2. admits queued requests into free slots, reusing what a slot's cache still holds or a saved prefix from the
   shared :class:`~runtime.llm.prefix_cache.PrefixCache`; when an URGENT request waits and no slot is free, the
   scheduler names a BATCH victim, whose KV state is saved to the prefix cache and which is requeued (its
   sampler and text travel with it; it resumes where it stopped);
3. builds one batch: the next token of every decoding slot, then prompt chunks (at most ``prefill_chunk``
   tokens while others decode, so a long prompt does not stall them);
4. one ``llama_decode``; each slot that got logits samples its next token with its own sampler.

Speculative decoding, per slot (on unless ``speculate=False``): a decoding slot's row carries its next token and
a draft of up to ``k`` tokens after it (prompt lookup over the request's own tokens, runtime/llm/speculative.py),
with the logits of every position kept; drafts use only the batch room left after every slot's next token and
the prompt chunks. After the step's one ``llama_decode`` the slot samples at each drafted position with its own
sampler and accepts while the sample equals the draft (sample-and-compare): the tokens, and the sampler's
draws, are those of plain decoding, so greedy text is unchanged. The rejected tokens' cells are removed from
that sequence (``llama_memory_seq_rm``); ``kv.tokens`` always says what the cells hold, so preemption saves
accepted tokens only. Each request's :class:`~runtime.llm.speculative.Adaptive` controller sets ``k`` from the
request's acceptance and the cost of a draft token to the whole batch (runtime/serving/engine_spec.py), and stops
drafting when it does not pay. Per-request counts are in ``EngineResult.speculation``, totals in
:meth:`Engine.stats` (``spec_drafted``, ``spec_accepted``).

Greedy text equals the single-stream LLM's token for token for SmolLM2's Q4_1 (tested: 4 concurrent requests,
preempted ones too). It is not guaranteed for every model. Observed (by hand, not in a test) with Gemma 3 Q4_K_M
on x86 CPU: one prompt of three prefilled in one batch ended "red, blue and yellow" where alone it says "red,
yellow, and blue". The likely cause, NOT confirmed: a row computed beside others is rounded differently than the
same row alone (for example, llama.cpp picking other CPU kernels for a multi-row batch of some weight types),
which can tip a near-tie the other way. No test pins which models or quantizations differ.

The step loop itself is in runtime/serving/engine_loop.py.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from runtime.backends.llamacpp_batch import LlamaCppBatch
from runtime.bundle.resolve import ResolvedModel
from runtime.errors import BadInput
from runtime.llm.decoding import Truncation
from runtime.llm.language_model import LanguageModel
from runtime.llm.loader import open_llm
from runtime.llm.plan import KVType, MemoryPlan
from runtime.llm.prefix_cache import PrefixCache
from runtime.llm.sampling import SamplingParams
from runtime.llm.speculative import PromptLookup, Speculator
from runtime.serving.engine_loop import Loop
from runtime.serving.engine_requests import EngineResult, Event, GenHandle, GenRequest
from runtime.serving.engine_seq import SeqState
from runtime.serving.scheduler import Job, Priority, Scheduler

__all__ = ["Engine", "EngineResult", "Event", "GenHandle", "GenRequest", "Priority"]

log = logging.getLogger(__name__)
DEFAULT_SLOTS = 4
DEFAULT_PREFILL_CHUNK = 128  # prompt tokens per step while other slots decode


class Engine(LanguageModel):
    """A loaded model serving ``n_slots`` requests at once. Close it (or use ``with``) to stop and free it.

    Its text side (sampling defaults, tokenizer, chat template, a conversation's fit) is the single-stream LLM's:
    both are a :class:`~runtime.llm.language_model.LanguageModel`; each request is a
    :class:`~runtime.llm.decoding.Decoding`, as the single stream's generation is."""

    def __init__(self, model: ResolvedModel, plan: MemoryPlan, backend: LlamaCppBatch, placement: Any, *,
                 max_queued: int = 64, aging_s: float = 5.0, prefill_chunk: int | None = None, speculate: bool = True,
                 start: bool = True) -> None:
        """Takes ownership of ``backend`` (closed here if the engine cannot be set up). ``speculate``: each request
        drafts by prompt lookup and its slot verifies the draft in the step's batch (see below); False: one token
        per slot and step. ``start`` False: no thread; the caller drives :meth:`step` (tests)."""
        self.model, self.plan, self.backend, self.placement = model, plan, backend, placement
        self.speculate = speculate
        self._thread: threading.Thread | None = None
        try:
            spec = model.manifest.llm
            if spec is None:
                raise BadInput(f"{model.manifest.ref} has no llm section in its manifest")
            self.defaults = SamplingParams.from_defaults(spec.sampling)
            self.n_slots, self.slot_ctx = backend.n_slots, backend.slot_ctx
            self.n_vocab = backend.n_vocab
            # a sliding-window cache keeps shorter entries: its loaded states cannot be cut short exactly
            self.prefix_cache = PrefixCache(plan.prefix_cache_bytes, supersede=not plan.kv_swa_bytes)
            self.scheduler = Scheduler(max_queued=max_queued, aging_s=aging_s)
            chunk = DEFAULT_PREFILL_CHUNK if prefill_chunk is None else prefill_chunk
            if not 1 <= chunk <= backend.n_batch:
                raise BadInput(f"prefill_chunk {chunk} is not valid: use 1 to {backend.n_batch} (the batch size)")
            self._loop = Loop(backend, self.scheduler, self.prefix_cache, plan, chunk)
        except BaseException:
            backend.close()
            raise
        self._closed = False
        if start:
            self._thread = threading.Thread(target=self._loop.run, name="edgerun-engine", daemon=True)
            self._thread.start()

    @classmethod
    def load(cls, model: str | ResolvedModel, *, memory: int | str | None = None, slots: int = DEFAULT_SLOTS,
             ctx: int | None = None, threads: int | None = None, kv_type: KVType | str | None = None,
             prefix_cache_bytes: int | None = None, max_queued: int = 64, aging_s: float = 5.0,
             target: str = "auto", require_accelerator: bool = False, prefill_chunk: int | None = None,
             speculate: bool = True, start: bool = True) -> Engine:
        """Resolve, plan (``slots`` sequences of ``ctx`` tokens each; without ``ctx`` the planner splits the
        context between them), place (``threads``: the placement's, the one thread budget of the engine), load."""
        opened = open_llm(model, memory=memory, ctx=ctx, kv_type=kv_type, threads=threads, target=target,
                          require_accelerator=require_accelerator, prefix_cache_bytes=prefix_cache_bytes, slots=slots,
                          backend=LlamaCppBatch)
        return cls(opened.model, opened.plan, opened.backend, opened.placement, max_queued=max_queued, aging_s=aging_s,
                   prefill_chunk=prefill_chunk, speculate=speculate, start=start)

    # -- requests ------------------------------------------------------------------------------------------------
    def submit(self, req: GenRequest) -> GenHandle:
        """Queue ``req``; its handle streams the answer. QueueFull when its class's queue is at its bound,
        BadInput for a prompt that cannot fit a slot (without ``truncate``), Cancelled once closed."""
        prompt = req.prompt
        if not isinstance(prompt, (list, tuple)) or not prompt:
            raise BadInput("the prompt has no tokens")
        bad = next((t for t in prompt if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.n_vocab), None)
        if bad is not None:  # llama.cpp would fail the whole step's batch on it
            raise BadInput(f"prompt token {bad!r} is not a token of this model (ids 0 to {self.n_vocab - 1})")
        params = self.check_params(req.params or self.defaults)
        job = Job(payload=None, priority=Priority(req.priority), deadline=req.deadline, preemptible=req.preemptible)
        handle = GenHandle(job)
        # A drafter and controller of its own: acceptance is the request's (its text), so is the on/off state.
        speculator = Speculator(PromptLookup()) if self.speculate and req.speculate else None
        seq = SeqState(handle, prompt, params, self.slot_ctx, n_keep=req.n_keep,
                       truncate=req.truncate, truncations=req.truncations, speculator=speculator)
        handle.truncations = list(seq.truncations)  # known now (turns dropped, the prompt cut): a header can say so
        job.payload = seq
        self.scheduler.submit(job)
        return handle

    def generate(self, req: GenRequest, timeout: float | None = None) -> EngineResult:
        """Submit and wait for the whole answer."""
        return self.submit(req).result(timeout)

    @property
    def n_ctx(self) -> int:
        """The context one request gets: a slot's cells."""
        return self.slot_ctx

    def chat_prompt(self, messages: list[dict[str, str]], params: SamplingParams | None = None
                    ) -> tuple[list[int], list[Truncation]]:
        """The model's chat template over ``messages`` as prompt tokens (user text never becomes control tokens),
        oldest turns dropped to fit a slot, as the single-stream chat does; the drops are reported."""
        prompt = self.fit_chat(messages, params)
        return prompt.tokens, prompt.truncations

    def chat_request(self, messages: list[dict[str, Any]], params: SamplingParams | None = None, *,
                     interrupt: Callable[[], None] | None = None, tools: list[dict[str, Any]] | None = None,
                     **fields: Any) -> GenRequest:
        """A :class:`GenRequest` for ``messages`` (``fields``: priority, deadline, truncate...); the system
        prompt is kept (``n_keep``) when the context must shift. Without ``truncate`` a conversation that would
        lose turns is refused (BadInput). ``interrupt``: see :func:`runtime.llm.chat.fit_chat`."""
        params = params or self.defaults
        prompt = self.fit_chat(messages, params, interrupt=interrupt, truncate=bool(fields.get("truncate", False)),
                               tools=tools)
        return GenRequest(prompt.tokens, params, n_keep=prompt.n_keep, truncations=prompt.truncations, **fields)

    # -- driving and state ---------------------------------------------------------------------------------------
    def step(self) -> bool:
        """One engine step (only without the engine thread): False when there was nothing to do."""
        if self._thread is not None:
            raise RuntimeError("the engine thread is running; step() is for an engine loaded with start=False")
        return self._loop.step()

    def slots(self) -> list[int | None]:
        """The job id in each slot (None: free)."""
        return self._loop.slot_jobs()

    def stats(self) -> dict[str, Any]:
        """Slots busy, queued requests per priority, prefix-cache hits and misses, tokens, preemptions."""
        depth = self.scheduler.depth()
        return {"slots": self.n_slots, "slot_ctx": self.slot_ctx, "threads": self.placement.threads,
                "speculate": self.speculate,
                "slots_busy": sum(j is not None for j in self.slots()),
                "queued": {p.name.lower(): depth[p] for p in Priority}, "prefix_cache": self.prefix_cache.stats(),
                **self._loop.counters()}

    def close(self) -> None:
        """Stop the engine thread; queued and running requests end with Cancelled; native memory is freed."""
        if self._closed:
            return
        self._closed = True
        self.scheduler.close()  # queued requests: Cancelled (on_drop)
        self._loop.stop()
        if self._thread is not None:
            self._thread.join()
        for job in self.scheduler.drain():  # requeued by a preemption while closing
            self._loop.dropped(job, "cancelled")
        self._loop.cancel_running("the engine was closed")
        self.backend.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
