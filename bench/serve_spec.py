"""Speculative decoding in `edgerun serve`: the same server with and without it (``--no-speculate``), same GGUF,
threads and slots as bench/serve.py, at 1 and 4 concurrent streaming clients, on two workloads:

* ``stories``: bench/serve.py's distinct story openings (``/v1/completions``): nothing to look up, so the
  adaptive controller should keep drafting off and cost (almost) nothing;
* ``rewrite``: "Repeat this text exactly: ..." chats over distinct short texts (``/v1/chat/completions``): the
  answer copies the prompt, which prompt lookup drafts.

Aggregate tokens/s (every completion token over the wall time), TTFT p50/p95, and the server's
edgerun_spec_* counters. Runs only when the 1-minute load average is below ``--max-load`` (default 3),
waiting up to ``--wait-quiet`` seconds for it; otherwise it reports the load and measures nothing.

    python bench/serve_spec.py [--levels 1 4] [--out bench/results/serve_spec.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from apps.loadtest.run import LoadSpec, arun_load  # noqa: E402
from apps.loadtest.workload import Prompt  # noqa: E402
from bench.serve import MODEL_NAME, PLACES, SLOTS, SUBJECTS, THREADS, TOKENS, Server, command, free_port, gguf_of, prompts  # noqa: E402


def rewrites(n: int, tag: str) -> tuple[Prompt, ...]:
    out = []
    for i in range(n):
        who, where = SUBJECTS[i % len(SUBJECTS)], PLACES[(i + len(tag)) % len(PLACES)]
        text = (f"{who.capitalize()} lived {where}. Every morning {who} walked to the market, bought bread and talked "
                f"with the neighbours about the weather, the harvest and the news from the city. In the evening {who} "
                f"wrote a letter ({tag} {i}).")
        out.append(Prompt(messages=({"role": "user", "content": f"Repeat this text exactly: {text}"},)))
    return tuple(out)


def spec_counts(base: str) -> dict[str, float]:
    text = httpx.get(base + "/metrics", timeout=10, trust_env=False).text
    out = {}
    for line in text.splitlines():
        for name in ("edgerun_spec_drafted_total", "edgerun_spec_accepted_total"):
            if line.startswith(name + "{"):
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


async def one_level(base: str, workload: str, n: int, tag: str) -> dict:
    per_client = max(1, -(-4 // n))
    if workload == "stories":
        ps, api = prompts(n * per_client, tag), "completions"
    else:
        ps, api = rewrites(n * per_client, tag), "chat"
    spec = LoadSpec(base=base, concurrency=n, duration_s=900, prompts=ps, max_tokens=TOKENS, temperature=0.0, api=api,
                    model=MODEL_NAME, requests_per_client=per_client, request_timeout_s=600)
    r = await arun_load(spec)
    return {"clients": n, "counts": r.counts, "tokens_per_s": r.tokens_per_s, "tokens": r.tokens,
            "ttft_ms": r.ttft_ms, "wall_s": r.wall_s, "load1": os.getloadavg()[0]}


def bench(gguf: Path, workdir: Path, speculate: bool, levels: tuple[int, ...]) -> dict:
    port = free_port()
    argv = command("edgerun", gguf, port, workdir) + ([] if speculate else ["--no-speculate"])
    name = "edgerun" if speculate else "edgerun --no-speculate"
    server = Server(name, argv, port, workdir / f"{'spec' if speculate else 'plain'}.log")
    out: dict = {"argv": argv, "runs": {}}
    try:
        server.start()
        warm = LoadSpec(base=server.base, concurrency=1, duration_s=300, prompts=prompts(1, "warm"), max_tokens=8,
                        api="completions", model=MODEL_NAME, requests_per_client=1, request_timeout_s=300)
        asyncio.run(arun_load(warm))
        for workload in ("stories", "rewrite"):
            for n in levels:
                before = spec_counts(server.base)
                row = asyncio.run(one_level(server.base, workload, n, f"{workload}-{n}"))
                after = spec_counts(server.base)
                row["drafted"] = after.get("edgerun_spec_drafted_total", 0) - before.get("edgerun_spec_drafted_total", 0)
                row["accepted"] = after.get("edgerun_spec_accepted_total", 0) - before.get("edgerun_spec_accepted_total", 0)
                out["runs"][f"{workload}@{n}"] = row
                print(f"  {name} {workload} {n} clients: {row['tokens_per_s']:.1f} tok/s, TTFT p50 "
                      f"{row['ttft_ms']['p50']:.0f} ms, drafted {row['drafted']:.0f} accepted {row['accepted']:.0f}, "
                      f"load {row['load1']:.2f}", flush=True)
        out["status"] = "ok"
    except Exception as exc:  # recorded; the other mode still runs
        out["status"] = f"failed: {type(exc).__name__}: {exc}"
        out["log_tail"] = server.tail(10)
    finally:
        server.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", nargs="+", type=int, default=[1, 4], metavar="N")
    ap.add_argument("--model", default="default")
    ap.add_argument("--max-load", type=float, default=3.0, help="measure only below this 1-minute load (default 3)")
    ap.add_argument("--wait-quiet", type=float, default=0, metavar="S", help="wait up to S seconds for that load")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "serve_spec.json"))
    args = ap.parse_args()
    start = time.monotonic()
    while os.getloadavg()[0] >= args.max_load and time.monotonic() - start < args.wait_quiet:
        time.sleep(10)
    load = os.getloadavg()[0]
    if load >= args.max_load:
        print(f"not measured: 1-minute load average {load:.2f} >= {args.max_load}", file=sys.stderr)
        return 1
    gguf = gguf_of(args.model)
    results: dict = {"model": args.model, "gguf": str(gguf), "threads": THREADS, "slots": SLOTS, "tokens": TOKENS,
                     "load_at_start": os.getloadavg(), "cpus": os.cpu_count(), "modes": {}}
    with tempfile.TemporaryDirectory(prefix="edgerun-bench-spec-") as tmp:
        for speculate in (False, True):
            results["modes"]["speculate" if speculate else "plain"] = bench(gguf, Path(tmp), speculate, tuple(args.levels))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print("| workload | clients | plain tok/s | speculate tok/s | ratio | accepted/drafted |")
    print("|---|---:|---:|---:|---:|---:|")
    plain, spec = results["modes"]["plain"].get("runs", {}), results["modes"]["speculate"].get("runs", {})
    for key, p in plain.items():
        s = spec.get(key)
        if s:
            workload, n = key.split("@")
            print(f"| {workload} | {n} | {p['tokens_per_s']:.1f} | {s['tokens_per_s']:.1f} | "
                  f"{s['tokens_per_s'] / p['tokens_per_s']:.2f}x | {s['accepted']:.0f}/{s['drafted']:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
