"""A canary version beside the deciding one: a fraction of the parts is also run through it, off the line.

The canary's verdicts never reach the PLC: they are compared with the deciding version's, and each disagreement is
logged and counted, so that an operator promotes (or rolls back) a new version on evidence. The canary runs in
its own :class:`runtime.serving.batcher.DynamicBatcher`, so it never delays a decision; when its queue is full a part is
skipped (counted), not waited for.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import Counter, deque
from typing import Any

from apps.kiosk.adapters import adapter_for, identity
from apps.kiosk.policy import Policy
from apps.kiosk.types import Part, Verdict
from runtime.errors import BadInput, Cancelled, QueueFull, one_line
from runtime.residency.manager import ModelSpec, ResidencyManager
from runtime.serving.batcher import DynamicBatcher

log = logging.getLogger(__name__)

RECENT = 20  # disagreements kept for the dashboard
MAX_QUEUED = 64


class Canary:
    def __init__(self, spec: ModelSpec, version: str, fraction: float, residency: ResidencyManager, policy: Policy) -> None:
        self.spec, self.ref, self.version, self.fraction = spec, spec.ref, version, fraction
        self.residency, self.policy = residency, policy
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._counts: Counter[str] = Counter()
        self._recent: deque[dict[str, Any]] = deque(maxlen=RECENT)
        self._batcher = DynamicBatcher(self._run, max_batch=8, max_wait_ms=20, max_queued=MAX_QUEUED,
                                       name=f"kiosk-{spec.name}")

    def selects(self, n: int) -> bool:
        """Whether the ``n``-th decided part (0-based) goes to the canary: evenly ``fraction`` of them, the first
        one included."""
        return math.ceil((n + 1) * self.fraction) > math.ceil(n * self.fraction)

    def offer(self, part: Part, verdict: Verdict, version: str) -> None:
        """Compare the canary's verdict for ``part`` with ``verdict`` (decided by ``version``), later, off the line."""
        try:
            job = self._batcher.submit((part, verdict, version))
        except (QueueFull, Cancelled):
            self._count("skipped")
            return
        self._count("offered")
        job.add_done_callback(self._done)

    def _done(self, job: Any) -> None:
        exc = None if job.cancelled() else job.exception()
        if isinstance(exc, Cancelled):  # the canary ended with the part still queued
            self._count("skipped")
        elif exc is not None:
            self._count("errors")
            log.warning("canary %s: a comparison failed: %s", self.ref, one_line(exc))
        with self._idle:
            self._counts["finished"] += 1
            self._idle.notify_all()

    def _count(self, key: str) -> None:
        with self._lock:
            self._counts[key] += 1

    def _run(self, items: list[tuple[Part, Verdict, str]]) -> list[None]:
        with self.residency.acquire(self.spec.name) as model:
            adapter = adapter_for(model)
            _, version, _ = identity(model)
            prepared, kept = [], []
            for item in items:
                try:
                    prepared.append(adapter.prepare(model, item[0].image))
                    kept.append(item)
                except BadInput:
                    self._count("errors")
            outputs = adapter.infer(model, prepared) if prepared else []
            rulings = [adapter.rule(model, self.policy, out)[0] for out in outputs]
        for (part, verdict, stable), ruling in zip(kept, rulings, strict=True):
            with self._lock:
                self._counts["compared"] += 1
                if ruling.verdict == verdict:
                    continue
                self._counts["disagreed"] += 1
                self._recent.append({"seq": part.seq, "frame_id": part.frame_id, "stable": verdict.value,
                                     "stable_version": stable, "canary": ruling.verdict.value, "canary_version": version,
                                     "canary_reason": ruling.reason})
            log.warning("canary %s@%s: part %d (%s): %s says %s, the canary says %s (%s)", self.spec.name, version,
                        part.seq, part.frame_id, stable, verdict.value, ruling.verdict.value, ruling.reason)
        return [None] * len(items)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            c = self._counts
            return {"ref": self.ref, "version": self.version, "fraction": self.fraction, "compared": c["compared"],
                    "disagreed": c["disagreed"], "skipped": c["skipped"], "errors": c["errors"],
                    "disagreement_rate": c["disagreed"] / c["compared"] if c["compared"] else None,
                    "recent": list(self._recent)}

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every part offered so far has been compared (up to ``timeout`` s): for promote-on-evidence."""
        with self._idle:
            return self._idle.wait_for(lambda: self._counts["finished"] >= self._counts["offered"], timeout)

    def close(self) -> None:
        self._batcher.close()
