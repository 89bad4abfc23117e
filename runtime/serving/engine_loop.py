"""The engine's step loop (see runtime/serving/engine.py for what one step does). Runs on the engine thread only."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from runtime.backends.llamacpp_batch import LlamaCppBatch, Row, SequenceView
from runtime.errors import BackendError, Cancelled, DeadlineExceeded, EdgerunError
from runtime.llm.kv import KVSequence
from runtime.llm.plan import MemoryPlan
from runtime.llm.prefix_cache import PrefixCache, common_prefix
from runtime.llm.speculative import verify
from runtime.serving.engine_requests import Event
from runtime.serving.engine_seq import SeqState
from runtime.serving.engine_spec import StepCost
from runtime.serving.scheduler import Job, Scheduler

log = logging.getLogger(__name__)
IDLE_WAIT_S = 0.05  # an idle engine looks at cancelled queued requests this often


@dataclass
class Slot:
    id: int  # = llama.cpp sequence id
    kv: KVSequence  # the tokens in this sequence's KV cells (kv.tokens), kept as the single stream keeps its own
    job: Job | None = None

    @property
    def seq(self) -> SeqState:
        assert self.job is not None
        return self.job.payload


class Loop:
    def __init__(self, backend: LlamaCppBatch, scheduler: Scheduler, cache: PrefixCache, plan: MemoryPlan,
                 prefill_chunk: int) -> None:
        self.backend, self.scheduler, self.cache, self.plan = backend, scheduler, cache, plan
        self.prefill_chunk = prefill_chunk
        self.slots = [Slot(i, KVSequence(SequenceView(backend, i), cache)) for i in range(backend.n_slots)]
        self._stop = threading.Event()
        self._order = 0  # admission order, for fair prefill chunks
        self._admitted: dict[int, int] = {}  # slot id -> admission order
        self.steps = self.decoded = self.prefilled = self.preemptions = self.finished = self.failed = 0
        self.drafted = self.accepted = 0  # speculative decoding: draft tokens verified, and accepted
        self.cost = StepCost()
        scheduler.on_drop = self.dropped

    # -- the thread --------------------------------------------------------------------------------------------------
    def run(self) -> None:
        while not self._stop.is_set():
            try:
                busy = self.step()
            except Exception as exc:  # a native failure or a bug: the running requests fail, the engine goes on
                log.exception("engine step failed")
                self.fail_running(exc if isinstance(exc, EdgerunError) else BackendError(f"engine step failed: {exc}"))
                busy = False
            if not busy:
                self.scheduler.wait(IDLE_WAIT_S)

    def stop(self) -> None:
        """End :meth:`run` (after the scheduler is closed, which wakes an idle wait)."""
        self._stop.set()

    def slot_jobs(self) -> list[int | None]:
        return [s.job.id if s.job is not None else None for s in self.slots]

    def counters(self) -> dict[str, int]:
        return {"steps": self.steps, "tokens_decoded": self.decoded, "prompt_tokens_computed": self.prefilled,
                "preemptions": self.preemptions, "requests_done": self.finished, "requests_failed": self.failed,
                "spec_drafted": self.drafted, "spec_accepted": self.accepted}

    # -- one step ------------------------------------------------------------------------------------------------------
    def step(self) -> bool:
        now = time.monotonic()
        for slot in self.slots:
            job = slot.job
            if job is not None and (job.is_cancelled or job.expired(now)):
                self._end(slot, self._stopped_error(job, "cancelled" if job.is_cancelled else "deadline", running=True))
        self.scheduler.sweep(now)
        self._admit(now)
        work = self._rows()
        if not work:
            return False
        self.steps += 1
        t0 = time.perf_counter()
        try:
            where = self.backend.decode([row for _, row in work])
        except BackendError as exc:
            for slot, _ in work:
                slot.kv.clear()
                self._end(slot, exc)
            return True
        seconds = time.perf_counter() - t0
        n_dec = sum(row.logits_all for _, row in work)
        if n_dec == len(work):  # decode rows only: a prompt chunk's tokens cost differently
            self.cost.observe(sum(len(row.tokens) for _, row in work), seconds)
        for (slot, row), index in zip(work, where, strict=True):
            slot.kv.tokens.extend(row.tokens)  # decoded above, with the other slots' rows
            if index >= 0:
                self._sampled(slot, index, row.tokens[1:] if row.logits_all else (), n_dec)
        return True

    def _admit(self, now: float) -> None:
        while True:
            free = [s for s in self.slots if s.job is None]
            if not free:
                victim = self.scheduler.choose_victim([s.job for s in self.slots if s.job is not None], now)
                if victim is None:
                    return
                slot = next(s for s in self.slots if s.job is victim)
                self._preempt(slot)
                free = [slot]
            job = self.scheduler.pop(now)
            if job is None:
                return
            seq: SeqState = job.payload
            # The free slot whose cache already holds the longest start of this prompt.
            slot = max(free, key=lambda s: common_prefix(s.kv.tokens, seq.tokens))
            # Its own cells, a saved prefix, or cells after a gap (a chat that dropped turns): runtime/llm/kv.py.
            seq.admitted(slot.kv.prepare(seq.tokens))
            # Cells past kv.tokens (a gap shift leaves the old tail there) would break the positions of the next
            # rows; the single-sequence backend's decode drops them (Llama.eval), here they go at admission.
            self.backend.remove(slot.id, len(slot.kv.tokens), -1)
            if seq.sampler is None:
                seq.sampler = self.backend.new_sampler(seq.params)
            slot.job = job
            self._order += 1
            self._admitted[slot.id] = self._order

    def _preempt(self, slot: Slot) -> None:
        """Give ``slot`` up: its KV state goes to the prefix cache (when it fits the bound), the job back to the
        front of its queue with its sampler and text, to resume where it stopped."""
        job, seq = slot.job, slot.seq
        assert job is not None
        slot.kv.save_prefix()  # within the prefix cache's bound; resumed by recomputing when it does not fit
        seq.preemptions += 1
        self.preemptions += 1
        slot.job = None
        self.scheduler.requeue(job)
        log.info("preempted request %d in slot %d after %d tokens (%d cached)", job.id, slot.id, seq.out, len(slot.kv.tokens))

    def _rows(self) -> list[tuple[Slot, Row]]:
        """This step's batch: one token of every decoding slot, then prompt chunks, oldest admission first, then
        the decoding slots' drafts in the room the batch has left (runtime/llm/speculative.py)."""
        budget = self.backend.n_batch
        work: list[tuple[Slot, Row]] = []
        prefill: list[Slot] = []
        for slot in self.slots:
            if slot.job is None:
                continue
            cached = slot.kv.tokens
            if len(cached) >= self.backend.slot_ctx:
                self._shift(slot)
                cached = slot.kv.tokens
            todo = len(slot.seq.tokens) - len(cached)
            if todo == 1:  # all logits kept: the one token's, or a draft's after it (added below)
                work.append((slot, Row(slot.id, slot.seq.tokens[-1:], len(cached), True, logits_all=True)))
                budget -= 1
            elif todo > 1:
                prefill.append(slot)
        decoding = len(work)
        if work:
            budget = min(budget, self.prefill_chunk)
        for slot in sorted(prefill, key=lambda s: self._admitted[s.id]):
            if budget <= 0:
                break
            start = len(slot.kv.tokens)
            todo = slot.seq.tokens[start:]
            chunk = todo[:budget]
            work.append((slot, Row(slot.id, chunk, start, len(chunk) == len(todo))))
            budget -= len(chunk)
        room = self.backend.n_batch - sum(len(row.tokens) for _, row in work)
        for i in range(decoding):
            slot, row = work[i]
            draft = self._draft(slot, row, room)
            if draft:
                work[i] = (slot, Row(row.seq, [*row.tokens, *draft], row.start, True, logits_all=True))
                room -= len(draft)
        return work

    def _draft(self, slot: Slot, row: Row, room: int) -> list[int]:
        """The tokens ``slot``'s drafter proposes after its pending token (none when its controller says a plain
        step): at most ``room`` (the batch), the cells left in the slot, and the tokens the request may still get."""
        seq = slot.seq
        spec = seq.speculator
        if spec is None:
            return []
        ctl = spec.controller
        k = ctl.plan(min(room, self.backend.slot_ctx - row.start - 1, seq.params.max_tokens - seq.out - 1))
        start = time.perf_counter()
        try:
            if k:
                return spec.drafter.draft(seq.tokens, k)
            if ctl.wants_shadow() and spec.drafter.cheap:  # off: would its drafts have been accepted? (costs nothing)
                ctl.shadow(spec.drafter.draft(seq.tokens, ctl.k_max))
            return []
        finally:
            seq.spec.draft_s += time.perf_counter() - start

    def _shift(self, slot: Slot) -> None:
        """The slot is full: drop half of what follows the first n_keep tokens, as the single stream does."""
        seq, kv = slot.seq, slot.kv
        dropped = kv.shift(seq.n_keep, (len(kv.tokens) - seq.n_keep) // 2)
        seq.tokens = kv.tokens + seq.tokens[-1:]  # what the cells hold now, then the pending token
        seq.shifted(dropped)

    def _sampled(self, slot: Slot, index: int, draft: Sequence[int] = (), n_dec: int = 1) -> None:
        """Sample the slot's next tokens from batch index ``index`` on: one, or with a ``draft`` (decoded after
        the pending token, logits at each) sample-and-compare (runtime/llm/speculative.verify), each token emitted as
        plain decoding emits it; the cells of rejected draft tokens are removed, so that ``kv.tokens`` stays what
        the cells hold. ``n_dec``: slots decoding in this step (what a draft token cost them all: StepCost)."""
        seq = slot.seq
        if not seq.prefilled:
            seq.prefilled = True
            self.prefilled += seq.computed
            if seq.computed > 1 and not seq.preemptions:
                slot.kv.save_prefix()  # the prompt, for later requests that share its start
        sampler, spec = seq.sampler, seq.speculator
        confirmed = len(slot.kv.tokens) - len(draft)  # cells of emitted tokens; the draft's after them
        accepted, done = 0, False
        for token, in_cache in verify(lambda i: self.backend.sample(sampler, index + i), draft):
            piece, done = seq.accept(token, self.backend)
            self.decoded += 1
            if piece:
                seq.handle._push(Event("text", piece, logprobs=seq.take_logprobs()))
            if done:
                break
            if in_cache:
                confirmed += 1
                accepted += 1
            elif not draft and spec is not None:
                spec.controller.follow(token)  # a plain step: the shadow draft (if any) learns from it
        if len(slot.kv.tokens) > confirmed:
            self._truncate(slot, confirmed)
        if spec is not None:
            # counted as verified up to where verification stopped (an end inside the draft stops it early)
            drafted = len(draft) if not done else min(len(draft), accepted + 1)
            ctl = spec.controller
            ctl.observe(drafted, accepted, self.cost.relative(n_dec, drafted))
            if drafted:
                seq.verified(drafted, accepted, seq.tokens[: confirmed - accepted])
                self.drafted += drafted
                self.accepted += accepted
        if done:
            self._end(slot, None)

    def _truncate(self, slot: Slot, n: int) -> None:
        """Keep only the first ``n`` cells of ``slot`` (drop rejected draft tokens' cells). Where the cache refuses
        to drop a tail (KVSequence.truncate recomputes the first ``n`` instead), this request drafts no more."""
        if not slot.kv.truncate(n) and slot.job is not None and slot.seq.speculator is not None:
            slot.seq.speculator.controller.disable("the KV cache cannot drop draft cells in place")

    # -- ending requests ------------------------------------------------------------------------------------------------
    def _end(self, slot: Slot, error: EdgerunError | None) -> None:
        """Free ``slot`` at once: the request's last text and its result, or its error."""
        job, seq = slot.job, slot.seq
        assert job is not None
        slot.job = None
        seq.close()
        if error is not None:
            self.failed += 1
            seq.handle._push(Event("error", error=error))
            return
        if seq.out > 1:  # the prompt and its answer: a chat's next turn extends them, whichever slot it gets
            slot.kv.save_prefix()  # (it supersedes the prompt's entry: runtime/llm/prefix_cache.py)
        piece, result = seq.engine_result(self.backend.slot_ctx, self.plan.kv_type.value, self.cache.stats())
        if piece:
            seq.handle._push(Event("text", piece, logprobs=seq.take_logprobs()))
        self.finished += 1
        self.scheduler.note_served(max(0.0, time.perf_counter() - seq.t_admit))
        seq.handle._push(Event("done", result=result))

    def dropped(self, job: Job, reason: str) -> None:
        """The scheduler took a queued job out (cancelled, deadline, or closing)."""
        seq: SeqState = job.payload
        seq.close()
        self.failed += 1
        seq.handle._push(Event("error", error=self._stopped_error(job, reason, running=False)))

    @staticmethod
    def _stopped_error(job: Job, reason: str, *, running: bool) -> EdgerunError:
        seq: SeqState = job.payload
        where = f"after {seq.out} generated tokens" if running else "while queued"
        if reason == "deadline":
            late = time.monotonic() - job.deadline if job.deadline is not None else 0.0
            return DeadlineExceeded(f"request {job.id}: its deadline passed {where} ({late * 1000:.0f} ms ago)")
        return Cancelled(f"request {job.id} was cancelled {where}")

    def fail_running(self, error: EdgerunError) -> None:
        """After a failed step: every running request ends with ``error``; its cells are dropped."""
        for slot in self.slots:
            if slot.job is not None:
                slot.kv.clear()
                self._end(slot, error)

    def cancel_running(self, why: str) -> None:
        for slot in self.slots:
            if slot.job is not None:
                self._end(slot, Cancelled(f"request {slot.job.id}: {why}"))
