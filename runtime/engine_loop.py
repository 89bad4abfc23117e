"""The engine's step loop (see runtime/engine.py for what one step does). Runs on the engine thread only."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from runtime.backends.llamacpp_batch import LlamaCppBatch, Row
from runtime.engine_requests import Event
from runtime.engine_seq import SeqState
from runtime.errors import BackendError, Cancelled, DeadlineExceeded, EdgerunError
from runtime.generation import Truncation
from runtime.kv import MIN_REUSE, Reuse
from runtime.plan import MemoryPlan
from runtime.prefix_cache import PrefixCache, common_prefix
from runtime.scheduler import Job, Scheduler

log = logging.getLogger(__name__)
IDLE_WAIT_S = 0.05  # an idle engine looks at cancelled queued requests this often


@dataclass
class Slot:
    id: int  # = llama.cpp sequence id
    cached: list[int] = field(default_factory=list)  # the tokens in this sequence's KV cells, positions 0..
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
        self.slots = [Slot(i) for i in range(backend.n_slots)]
        self._stop = threading.Event()
        self._order = 0  # admission order, for fair prefill chunks
        self._admitted: dict[int, int] = {}  # slot id -> admission order
        self.steps = self.decoded = self.prefilled = self.preemptions = self.finished = self.failed = 0
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
                "preemptions": self.preemptions, "requests_done": self.finished, "requests_failed": self.failed}

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
        try:
            where = self.backend.decode([row for _, row in work])
        except BackendError as exc:
            for slot, _ in work:
                self.backend.remove(slot.id, 0, -1)
                slot.cached = []
                self._end(slot, exc)
            return True
        for (slot, row), index in zip(work, where, strict=True):
            slot.cached.extend(row.tokens)
            if index >= 0:
                self._sampled(slot, index)
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
            slot = max(free, key=lambda s: common_prefix(s.cached, seq.tokens))
            seq.admitted(self._reuse(slot, seq.tokens))
            if seq.sampler is None:
                seq.sampler = self.backend.new_sampler(seq.params)
            slot.job = job
            self._order += 1
            self._admitted[slot.id] = self._order

    def _reuse(self, slot: Slot, target: list[int]) -> Reuse:
        """Leave the longest start of ``target`` that a cache has in ``slot`` (all but its last token at most, so
        that its logits are fresh): the slot's own cells, or a saved state when that covers more (runtime/kv.py)."""
        limit = len(target) - 1
        live = min(common_prefix(slot.cached, target), limit)
        source = "kv" if live else "none"
        if self.cache.capacity_bytes:
            entry, saved = self.cache.best(target[:limit])
            saved = min(saved, limit)
            if entry is not None and saved >= live + MIN_REUSE:
                if self.backend.load_state(slot.id, entry.state):
                    slot.cached, live, source = list(entry.tokens), saved, "saved"
                else:
                    slot.cached, live, source = [], 0, "none"
        if live < len(slot.cached):
            if self.backend.remove(slot.id, live, -1):
                del slot.cached[live:]
            else:
                self.backend.remove(slot.id, 0, -1)
                slot.cached, live, source = [], 0, "none"
        if live:
            self.cache.hits += 1
        else:
            self.cache.misses += 1
        return Reuse(live, source)

    def _preempt(self, slot: Slot) -> None:
        """Give ``slot`` up: its KV state goes to the prefix cache (when it fits the bound), the job back to the
        front of its queue with its sampler and text, to resume where it stopped."""
        job, seq = slot.job, slot.seq
        assert job is not None
        self._save(slot)
        seq.preemptions += 1
        self.preemptions += 1
        slot.job = None
        self.scheduler.requeue(job)
        log.info("preempted request %d in slot %d after %d tokens (%d cached)", job.id, slot.id, seq.out, len(slot.cached))

    def _save(self, slot: Slot) -> None:
        if self.cache.capacity_bytes and len(slot.cached) >= MIN_REUSE:
            # Make room before copying the state out: the cache's bound holds at every moment (runtime/kv.py).
            if self.cache.make_room(self.backend.state_size(slot.id), slot.cached):
                self.cache.put(slot.cached, self.backend.save_state(slot.id))

    def _rows(self) -> list[tuple[Slot, Row]]:
        """This step's batch: one token of every decoding slot, then prompt chunks, oldest admission first."""
        budget = self.backend.n_batch
        work: list[tuple[Slot, Row]] = []
        prefill: list[Slot] = []
        for slot in self.slots:
            if slot.job is None:
                continue
            if len(slot.cached) >= self.backend.slot_ctx:
                self._shift(slot)
            todo = len(slot.seq.tokens) - len(slot.cached)
            if todo == 1:
                work.append((slot, Row(slot.id, slot.seq.tokens[-1:], len(slot.cached), True)))
                budget -= 1
            elif todo > 1:
                prefill.append(slot)
        if work:
            budget = min(budget, self.prefill_chunk)
        for slot in sorted(prefill, key=lambda s: self._admitted[s.id]):
            if budget <= 0:
                break
            todo = slot.seq.tokens[len(slot.cached) :]
            chunk = todo[:budget]
            work.append((slot, Row(slot.id, chunk, len(slot.cached), len(chunk) == len(todo))))
            budget -= len(chunk)
        return work

    def _shift(self, slot: Slot) -> None:
        """The slot is full: drop half of what follows the first n_keep tokens (context shift, as runtime/kv.py)."""
        seq = slot.seq
        keep = min(seq.n_keep, len(slot.cached) // 2)
        discard = (len(slot.cached) - keep) // 2
        if self.backend.can_shift() and self.backend.remove(slot.id, keep, keep + discard):
            self.backend.shift(slot.id, keep + discard, -1, -discard)
            del slot.cached[keep : keep + discard]
        else:  # recompute what is kept
            self.backend.remove(slot.id, 0, -1)
            slot.cached = []
        del seq.tokens[keep : keep + discard]
        seq.truncations.append(Truncation("shift", discard, seq.out))
        log.info("slot %d context shift: dropped %d tokens after the first %d", slot.id, discard, keep)

    def _sampled(self, slot: Slot, index: int) -> None:
        seq = slot.seq
        if not seq.prefilled:
            seq.prefilled = True
            self.prefilled += seq.computed
            if seq.computed > 1 and not seq.preemptions:
                self._save(slot)  # the prompt, for later requests that share its start (runtime/kv.py save_prefix)
        token = self.backend.sample(seq.sampler, index)
        piece, done = seq.accept(token, self.backend)
        self.decoded += 1
        if piece:
            seq.handle._push(Event("text", piece))
        if done:
            self._end(slot, None)

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
        piece, result = seq.finish(self.backend.slot_ctx, self.plan.kv_type.value, self.cache.stats())
        if piece:
            seq.handle._push(Event("text", piece))
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
                self.backend.remove(slot.id, 0, -1)
                slot.cached = []
                self._end(slot, error)

    def cancel_running(self, why: str) -> None:
        for slot in self.slots:
            if slot.job is not None:
                self._end(slot, Cancelled(f"request {slot.job.id}: {why}"))
