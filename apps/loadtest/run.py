"""The timed run: N clients stream completions for S seconds; its statistics; the capacity search.

Every loop is bounded: a client issues requests until the run's time is up or the run's
request cap is reached; each request has its own time limit; a rejected (429) or failed
request is followed by a short pause (Retry-After, at most a second) so a refusing server is
not spun on; the capacity search runs at most ``max_steps`` timed runs.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace

import httpx

from apps.loadtest.client import OUTCOMES, Outcome, request_body, request_headers, stream_one
from apps.loadtest.workload import Prompt, load_prompts, pick_priority
from runtime.metrics import PercentileMethod, percentile

log = logging.getLogger(__name__)

MAX_REQUESTS = 1_000_000  # per timed run, whatever the duration
BACKOFF_CAP_S = 1.0


@dataclass(frozen=True)
class LoadSpec:
    base: str  # from target.loopback_base
    concurrency: int
    duration_s: float
    prompts: tuple[Prompt, ...] = field(default_factory=lambda: load_prompts(None))
    mix: tuple[tuple[str, float], ...] = (("interactive", 1.0),)
    max_tokens: int = 96
    temperature: float = 0.0
    api: str = "chat"  # "chat" | "completions"
    model: str | None = None  # None: the first of GET /v1/models, else "default"
    api_key: str | None = None
    use_cache: bool = False
    request_timeout_s: float = 120.0
    max_requests: int = MAX_REQUESTS
    requests_per_client: int | None = None  # a fixed count per client (the duration stays a cap)
    disconnect_fraction: float = 0.0  # this share of requests hangs up after a few chunks
    deadline_ms: int | None = None  # sent as X-Deadline-Ms (edgerun answers 504 when it passes)
    seed: int = 0


def _pct(values: list[float], q: float) -> float | None:
    return percentile(values, q, method=PercentileMethod.LINEAR) if values else None


def _ms(values: list[float]) -> dict[str, float | None]:
    ms = [v * 1000 for v in values]
    return {"p50": _pct(ms, 50), "p95": _pct(ms, 95), "p99": _pct(ms, 99)}


@dataclass
class Report:
    concurrency: int
    model: str
    api: str
    wall_s: float
    requests: int
    counts: dict[str, int]
    ttft_ms: dict[str, float | None]
    e2e_ms: dict[str, float | None]
    tokens: int
    tokens_per_s: float  # aggregate: every completion token over the run's wall time
    stream_decode_tps_p50: float | None  # one stream's own rate, after its first token
    by_priority: dict[str, dict]
    errors: dict[str, int]  # the commonest error lines and their counts
    load1: tuple[float, float]  # load average before and after: other processes skew every figure

    @classmethod
    def of(cls, outcomes: list[Outcome], concurrency: int, model: str, api: str, wall_s: float,
           load1: tuple[float, float]) -> Report:
        ok = [o for o in outcomes if o.status == "ok"]
        first = [o for o in outcomes if o.ttft_s is not None and o.status in ("ok", "disconnected")]
        by_priority = {}
        for name in sorted({o.priority for o in outcomes}):
            mine = [o for o in outcomes if o.priority == name]
            ttft = [o.ttft_s for o in mine if o.ttft_s is not None and o.status in ("ok", "disconnected")]
            by_priority[name] = {"requests": len(mine), "counts": dict(Counter(o.status for o in mine)),
                                 "ttft_ms": _ms(ttft), "e2e_ms": _ms([o.total_s for o in mine if o.status == "ok"])}
        tokens = sum(o.tokens for o in outcomes if o.status in ("ok", "disconnected"))
        rates = [r for r in (o.decode_tps for o in ok) if r is not None]
        return cls(
            concurrency=concurrency, model=model, api=api, wall_s=wall_s, requests=len(outcomes),
            counts={k: sum(o.status == k for o in outcomes) for k in OUTCOMES},
            ttft_ms=_ms([o.ttft_s for o in first]), e2e_ms=_ms([o.total_s for o in ok]),
            tokens=tokens, tokens_per_s=tokens / wall_s if wall_s > 0 else 0.0,
            stream_decode_tps_p50=_pct(rates, 50), by_priority=by_priority,
            errors=dict(Counter(o.error for o in outcomes if o.status == "error").most_common(5)), load1=load1)

    def meets(self, ttft_p95_s: float) -> bool:
        """The target is met when TTFT p95 is within it and every request was answered (no 429, 504 or error)."""
        p95 = self.ttft_ms["p95"]
        failed = self.counts["rejected"] + self.counts["timeout"] + self.counts["error"]
        return p95 is not None and p95 <= ttft_p95_s * 1000 and failed == 0

    def to_dict(self) -> dict:
        return asdict(self)


async def _first_model(client: httpx.AsyncClient, spec: LoadSpec) -> str:
    headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
    try:
        resp = await client.get(spec.base + "/v1/models", headers=headers, timeout=min(spec.request_timeout_s, 10.0))
        data = resp.json().get("data") if resp.status_code == 200 else None
        if isinstance(data, list) and data and isinstance(data[0], dict) and isinstance(data[0].get("id"), str):
            return data[0]["id"]
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        log.info("GET /v1/models failed (%s); using the model name 'default'", exc)
    return "default"


async def arun_load(spec: LoadSpec, client: httpx.AsyncClient | None = None) -> Report:
    """One timed run at ``spec.concurrency`` clients."""
    own = client is None
    if client is None:  # no proxies from the environment, no redirects: the requests stay on loopback
        client = httpx.AsyncClient(trust_env=False, follow_redirects=False,
                                   limits=httpx.Limits(max_connections=spec.concurrency + 1,
                                                       max_keepalive_connections=spec.concurrency + 1))
    try:
        model = spec.model or await _first_model(client, spec)
        load_before = os.getloadavg()[0]
        start = time.monotonic()
        end = start + spec.duration_s
        issued = itertools.count()
        outcomes: list[Outcome] = []

        async def worker(index: int) -> None:
            rng = random.Random(spec.seed * 100_003 + index)
            per_client = spec.requests_per_client if spec.requests_per_client is not None else spec.max_requests
            for _ in range(per_client):
                n = next(issued)
                if time.monotonic() >= end or n >= spec.max_requests:
                    return
                priority = pick_priority(spec.mix, rng)
                prompt = spec.prompts[n % len(spec.prompts)]
                # a client that goes away: after a few chunks, or (one in three) after a moment, queued or not
                hang_up = hang_up_s = None
                if rng.random() < spec.disconnect_fraction:
                    if rng.random() < 1 / 3:
                        hang_up_s = rng.uniform(0.1, 1.0)
                    else:
                        hang_up = rng.randint(1, 8)
                call = stream_one(client, spec.base, spec.api,
                                  request_body(spec.api, prompt, model, spec.max_tokens, spec.temperature),
                                  request_headers(priority, api_key=spec.api_key, use_cache=spec.use_cache,
                                                  deadline_ms=spec.deadline_ms),
                                  priority=priority, timeout_s=spec.request_timeout_s, hang_up_after=hang_up)
                sent = time.monotonic()
                try:
                    out = await (asyncio.wait_for(call, hang_up_s) if hang_up_s is not None else call)
                except asyncio.TimeoutError:  # cancelled mid-request: httpx closes the connection
                    out = Outcome(status="disconnected", priority=priority, started=sent, total_s=time.monotonic() - sent)
                outcomes.append(out)
                if out.status in ("rejected", "error"):
                    try:
                        pause = float(out.retry_after) if out.retry_after else 0.1
                    except ValueError:
                        pause = 0.1
                    await asyncio.sleep(max(0.0, min(pause, BACKOFF_CAP_S, end - time.monotonic())))

        await asyncio.gather(*(worker(i) for i in range(spec.concurrency)))
        wall = time.monotonic() - start
        return Report.of(outcomes, spec.concurrency, model, spec.api, wall, (load_before, os.getloadavg()[0]))
    finally:
        if own:
            await client.aclose()


def run_load(spec: LoadSpec) -> Report:
    return asyncio.run(arun_load(spec))


@dataclass
class Capacity:
    target_ttft_p95_s: float
    best: int  # the highest concurrency that met the target; 0 when even one client did not
    steps: list[dict]  # each timed run: concurrency, ttft p95 ms, counts, met
    report: Report | None  # the run at ``best``

    def to_dict(self) -> dict:
        return {"target_ttft_p95_s": self.target_ttft_p95_s, "best": self.best, "steps": self.steps,
                "report": self.report.to_dict() if self.report else None}


def find_capacity(spec: LoadSpec, target_ttft_p95_s: float, max_steps: int = 12) -> Capacity:
    """The highest concurrency up to ``spec.concurrency`` whose run meets the target.

    Doubling from 1 until a run fails or the ceiling is reached, then bisecting between the last
    pass and the first failure; at most ``max_steps`` timed runs of ``spec.duration_s`` each.
    (It assumes latency grows with load; a noisy machine can make one step's answer wrong.)
    """
    steps: list[dict] = []
    reports: dict[int, Report] = {}

    def probe(n: int) -> bool:
        report = run_load(replace(spec, concurrency=n))
        reports[n] = report
        met = report.meets(target_ttft_p95_s)
        steps.append({"concurrency": n, "ttft_p95_ms": report.ttft_ms["p95"], "counts": report.counts,
                      "tokens_per_s": report.tokens_per_s, "met": met})
        log.info("concurrency %d: TTFT p95 %s ms, %s", n, report.ttft_ms["p95"], "met" if met else "missed")
        return met

    ceiling = spec.concurrency
    good, bad = 0, None
    n = 1
    while len(steps) < max_steps:
        if probe(n):
            good = n
            if n == ceiling:
                break
            n = min(n * 2, ceiling)
        else:
            bad = n
            break
    while bad is not None and bad - good > 1 and len(steps) < max_steps:
        mid = (good + bad) // 2
        if probe(mid):
            good = mid
        else:
            bad = mid
    return Capacity(target_ttft_p95_s, good, steps, reports.get(good))

