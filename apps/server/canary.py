"""Canary rollout of a model version: a fraction of the traffic, compared with the stable version, rolled back on
its own when it does worse.

:class:`CanaryRouter` picks the version for each request (:meth:`pick`, from a seeded RNG, so a test or a replay
routes the same way), is told how each request ended (:meth:`record`), and keeps the last ``window`` outcomes per
version. Once the canary has ``min_requests`` outcomes it is rolled back automatically when

- its error rate exceeds the stable's by more than ``margin_error`` (absolute: 0.05 = five points), and by more
  than chance explains (the difference is ``ERROR_Z`` standard errors or more), or
- its p95 latency (of successful requests) exceeds the stable's p95 times ``margin_p95`` beyond chance: a
  distribution-free lower bound of the canary's p95 (an order statistic, ``LATENCY_Z``) is above the same upper
  bound of the stable's p95 times the margin,

and the reason, with the figures, is logged and kept in :meth:`state`. :meth:`promote` sends all traffic to the
canary, :meth:`rollback` all of it to the stable version (the admin endpoint calls these). A rollback after a
promotion undoes it; a rolled-back canary cannot be promoted (start a new rollout). A request already routed
keeps its version: :meth:`record` accepts outcomes of either version in every state.

Why the bounds: a rollout looks at its windows after every request, so a bare comparison of two small samples
rolls back an identical canary by chance sooner or later (identical versions at 2 % errors: 11-18 % of 2000-request
rollouts; at 5 %: 40 %; lognormal latencies with sigma 0.6: 14-28 %). With the bounds, in the same simulation, at
most 2 % are, while a canary that always fails is still rolled back at ``min_requests``, one failing 10 % against
1 % after a median 100-125 of its requests, and one twice as slow after 20-80 (sigma 0.1-0.3).

Thread-safe: one lock around the RNG, the windows and the state; ``on_change`` runs outside it.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from runtime.errors import BadInput
from runtime.metrics import PercentileMethod, percentile

log = logging.getLogger(__name__)

CANARY, PROMOTED, ROLLED_BACK = "canary", "promoted", "rolled_back"
ERROR_Z = 3.0  # standard errors an error-rate difference must reach: the windows are looked at after every request
LATENCY_Z = 2.33  # one-sided 99 % for each p95 bound; the two bounds and the margin together are conservative


def p95(values: list[float]) -> float:
    """The 95th percentile by the nearest-rank method (a value that occurred: the margin compares real requests)."""
    return percentile(values, 95, method=PercentileMethod.NEAREST_RANK)


def p95_bound(values: list[float], z: float, *, upper: bool) -> float:
    """A one-sided distribution-free confidence bound of the 95th percentile at ``z`` standard errors: the order
    statistic whose rank the binomial count of values below the percentile reaches (the largest or smallest value
    when the sample is too small to say more)."""
    ordered, n = sorted(values), len(values)
    spread = z * math.sqrt(n * 0.95 * 0.05)
    rank = math.ceil(0.95 * n + spread) + 1 if upper else math.floor(0.95 * n - spread)
    return ordered[min(n, max(1, rank)) - 1]


class _Window:
    def __init__(self, size: int) -> None:
        self.outcomes: deque[tuple[bool, float]] = deque(maxlen=size)
        self.requests = self.errors = 0  # totals since the rollout began

    def add(self, ok: bool, seconds: float) -> None:
        self.outcomes.append((ok, seconds))
        self.requests += 1
        self.errors += not ok

    def error_rate(self) -> float:
        return sum(not ok for ok, _ in self.outcomes) / len(self.outcomes) if self.outcomes else 0.0

    def ok_latencies(self) -> list[float]:
        return [s for ok, s in self.outcomes if ok]

    def summary(self) -> dict[str, Any]:
        lat = self.ok_latencies()
        return {"requests": self.requests, "errors": self.errors, "window": len(self.outcomes),
                "error_rate": round(self.error_rate(), 4), "p95_s": round(p95(lat), 6) if lat else None}


class CanaryRouter:
    def __init__(self, stable: str, canary: str, fraction: float, *, margin_error: float = 0.05, margin_p95: float = 1.5,
                 min_requests: int = 20, window: int = 200, rng: random.Random | None = None,
                 on_change: Callable[[str, str], None] | None = None, clock: Callable[[], float] = time.time) -> None:
        """``on_change(state, reason)`` is called after every transition (automatic or not), e.g. to release the
        version no longer served."""
        if not stable or not canary or stable == canary:
            raise BadInput(f"a canary needs two different versions, got stable {stable!r} and canary {canary!r}")
        if not _number(fraction) or not 0.0 <= fraction <= 1.0:
            raise BadInput(f"canary fraction {fraction!r} is not valid; give a number from 0 to 1 (0.1 = 10% of requests)")
        if not _number(margin_error) or not 0.0 <= margin_error < 1.0:
            raise BadInput(f"canary error-rate margin {margin_error!r} is not valid; give a number in [0, 1) (0.05 = 5 points)")
        if not _number(margin_p95) or not 1.0 <= margin_p95 <= 100.0:
            raise BadInput(f"canary p95 margin {margin_p95!r} is not valid; give a factor from 1 to 100 (1.5 = 50% slower)")
        if isinstance(min_requests, bool) or not isinstance(min_requests, int) or min_requests < 1:
            raise BadInput(f"canary min_requests {min_requests!r} is not valid; give a whole number >= 1")
        if isinstance(window, bool) or not isinstance(window, int) or window < min_requests:
            raise BadInput(f"canary window {window!r} is not valid; give a whole number >= min_requests ({min_requests})")
        self.stable, self.canary, self.fraction = stable, canary, float(fraction)
        self.margin_error, self.margin_p95, self.min_requests = float(margin_error), float(margin_p95), min_requests
        self.rng = rng if rng is not None else random.Random()
        self.on_change, self.clock = on_change, clock
        self._lock = threading.Lock()
        self._windows = {stable: _Window(window), canary: _Window(window)}
        self._state, self._reason, self._changed_at = CANARY, "", clock()

    def pick(self) -> str:
        """The version to serve the next request."""
        with self._lock:
            if self._state == PROMOTED:
                return self.canary
            if self._state == ROLLED_BACK:
                return self.stable
            return self.canary if self.rng.random() < self.fraction else self.stable

    def record(self, version: str, ok: bool, seconds: float) -> None:
        """How one request served by ``version`` ended: ``ok`` False for an error or a timeout (not for a client's
        own mistake, a 4xx); ``seconds`` end to end. May roll the canary back."""
        if version not in self._windows:
            raise BadInput(f"version {version!r} is not in this rollout; valid: {self.stable!r}, {self.canary!r}")
        if not _number(seconds) or not math.isfinite(seconds) or seconds < 0:
            raise BadInput(f"request time {seconds!r} is not valid; give seconds >= 0")
        with self._lock:
            self._windows[version].add(bool(ok), float(seconds))
            reason = self._verdict() if self._state == CANARY else None
            if reason is not None:
                self._set(ROLLED_BACK, reason)
        if reason is not None:
            log.warning("canary %s rolled back to %s automatically: %s", self.canary, self.stable, reason)
            self._notify(ROLLED_BACK, reason)

    def _verdict(self) -> str | None:
        """Why the canary should be rolled back now, or None. Called with the lock held."""
        stable, canary = self._windows[self.stable], self._windows[self.canary]
        if len(canary.outcomes) < self.min_requests:
            return None
        c_err, s_err = canary.error_rate(), stable.error_rate()
        if c_err > s_err + self.margin_error and c_err - s_err >= ERROR_Z * _difference_se(canary, stable):
            return (f"error rate {c_err:.1%} over its last {len(canary.outcomes)} requests exceeds the stable's "
                    f"{s_err:.1%} by more than {self.margin_error:.1%}")
        c_lat, s_lat = canary.ok_latencies(), stable.ok_latencies()
        if len(c_lat) >= self.min_requests and len(s_lat) >= self.min_requests:
            low, high = p95_bound(c_lat, LATENCY_Z, upper=False), p95_bound(s_lat, LATENCY_Z, upper=True)
            if low > high * self.margin_p95:
                return (f"p95 latency {p95(c_lat) * 1000:.0f} ms exceeds the stable's {p95(s_lat) * 1000:.0f} ms "
                        f"times {self.margin_p95:g} (bounds {low * 1000:.0f} and {high * 1000:.0f} ms)")
        return None

    def promote(self) -> dict[str, Any]:
        """All traffic to the canary from now on. Returns the new state."""
        with self._lock:
            if self._state == ROLLED_BACK:
                raise BadInput(f"canary {self.canary} was rolled back ({self._reason}); start a new rollout to try it again")
            changed = self._state != PROMOTED
            if changed:
                self._set(PROMOTED, "promoted by an operator")
        if changed:
            log.info("canary %s promoted: it now serves all traffic (was %s)", self.canary, self.stable)
            self._notify(PROMOTED, "promoted by an operator")
        return self.state()

    def rollback(self, reason: str) -> dict[str, Any]:
        """All traffic to the stable version from now on; ``reason`` is logged and kept. Rolling back twice keeps
        the first reason. Returns the new state."""
        reason = " ".join(str(reason).split())
        if not reason:
            raise BadInput("a rollback needs a reason (one line saying why)")
        with self._lock:
            changed = self._state != ROLLED_BACK
            if changed:
                self._set(ROLLED_BACK, reason)
        if changed:
            log.warning("canary %s rolled back to %s: %s", self.canary, self.stable, reason)
            self._notify(ROLLED_BACK, reason)
        return self.state()

    @property
    def serving(self) -> str:
        """The version that takes all traffic once the rollout is decided (the stable one while it runs)."""
        with self._lock:
            return self.canary if self._state == PROMOTED else self.stable

    def state(self) -> dict[str, Any]:
        with self._lock:
            return {"stable": self.stable, "canary": self.canary, "fraction": self.fraction, "state": self._state,
                    "reason": self._reason or None, "changed_at": self._changed_at,
                    "margin_error": self.margin_error, "margin_p95": self.margin_p95, "min_requests": self.min_requests,
                    "versions": {v: w.summary() for v, w in self._windows.items()}}

    def _set(self, state: str, reason: str) -> None:
        self._state, self._reason, self._changed_at = state, reason, self.clock()

    def _notify(self, state: str, reason: str) -> None:
        if self.on_change is None:
            return
        try:
            self.on_change(state, reason)
        except Exception:  # the transition stands; the hook's failure is the hook's
            log.exception("canary on_change hook failed after %s", state)


def _difference_se(canary: _Window, stable: _Window) -> float:
    """The standard error of the two windows' error-rate difference, each rate taken with one error and one success
    added (Agresti-Caffo), so that 0 of 20 or 20 of 20 is not certainty. A stable with no outcomes yet adds
    nothing: the canary is then compared with a clean record."""
    var = 0.0
    for window in (canary, stable):
        n = len(window.outcomes)
        if n:
            rate = (sum(not ok for ok, _ in window.outcomes) + 1) / (n + 2)
            var += rate * (1 - rate) / (n + 2)
    return math.sqrt(var)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not (isinstance(value, float) and math.isnan(value))
