"""LLM benchmark: edgerun vs raw llama-cpp-python on the packaged models.

For each model and thread count, in fresh processes: prefill and decode tokens/s
through edgerun and through llama-cpp-python's own ``Llama.generate`` on the same
GGUF and settings (context, KV type, flash attention, sliding-window cache),
and their ratio; TTFT cold vs with a shared 1,000-token prefix restored from the
prefix cache; planned vs measured peak RSS. Prints a table, writes JSON
(bench/results/llm.json). The machine's load average is recorded beside every
figure: llama.cpp's spinning threads collapse when another process competes.

    python bench/llm.py [--models smollm2-135m-instruct gemma3-270m] [--threads 1 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT_TOKENS = 512
DECODE_TOKENS = 128
CTX = 2048


def _prompt(n_words: int, salt: str = "") -> str:
    words = "edge devices run small language models offline with a fixed memory budget and careful planning".split()
    return salt + " ".join(words[i % len(words)] for i in range(n_words))


def worker_speed(model: str, threads: int, engine: str) -> dict:
    """One measurement in this (fresh) process."""
    from runtime.bundle.resolve import resolve
    from runtime.llm.model import LLM

    resolved = resolve(model)
    with LLM.load(resolved, memory="2G", ctx=CTX, kv_type="f16", threads=threads, prefix_cache_bytes=0) as llm:
        tokens = llm.tokenize(_prompt(2000))[:PROMPT_TOKENS]
        params = llm.params(temperature=0.0, max_tokens=DECODE_TOKENS, repeat_penalty=1.0)
        if engine == "edgerun":
            r = llm.generate(tokens, params)
            load = os.getloadavg()[0]
            return {
                "prefill_tps": r.prefill_tps,
                "decode_tps": r.decode_tps,
                "ttft_ms": r.ttft_ms,
                "tokens_out": r.tokens_out,
                "load1": load,
            }
        plan = llm.plan
    # raw llama-cpp-python, same file and settings, in the same fresh process after edgerun's model is closed
    from llama_cpp import Llama

    raw = Llama(
        str(resolved.path()),
        n_ctx=plan.n_ctx,
        n_batch=plan.n_batch,
        n_ubatch=plan.n_ubatch,
        n_threads=threads,
        n_threads_batch=threads,
        flash_attn=True,
        swa_full=False,
        type_k=1,
        type_v=1,
        verbose=False,
    )
    try:
        t0 = time.perf_counter()
        n, t_first = 0, 0.0
        for _tok in raw.generate(tokens, temp=0.0, repeat_penalty=1.0, top_k=40, top_p=0.95, min_p=0.05):
            now = time.perf_counter()
            if n == 0:
                t_first = now
            n += 1
            if n >= DECODE_TOKENS:
                break
        t_end = time.perf_counter()
    finally:
        raw.close()
    return {
        "prefill_tps": len(tokens) / (t_first - t0),
        "decode_tps": (n - 1) / (t_end - t_first),
        "ttft_ms": (t_first - t0) * 1000,
        "tokens_out": n,
        "load1": os.getloadavg()[0],
    }


def worker_ttft(model: str, threads: int) -> dict:
    from runtime.llm.model import LLM

    with LLM.load(model, memory="2G", ctx=CTX, threads=threads) as llm:
        prefix = llm.tokenize(_prompt(2000, "Manual: "))[:1000]
        params = llm.params(temperature=0.0, max_tokens=4)
        q1, q2 = llm.tokenize(" Question one?"), llm.tokenize(" Question two?")
        cold = llm.generate(prefix + q1, params)
        llm.generate(llm.tokenize(_prompt(300, "Unrelated: ")), params)  # replaces the live KV
        warm = llm.generate(prefix + q2, params)
        return {
            "cold_ttft_ms": cold.ttft_ms,
            "warm_ttft_ms": warm.ttft_ms,
            "warm_source": warm.reuse_source,
            "reused_tokens": warm.reused_tokens,
            "ratio": warm.ttft_ms / cold.ttft_ms,
            "load1": os.getloadavg()[0],
        }


def worker_rss(model: str, threads: int) -> dict:
    """Default plan (context from the budget), then a workload that fills context and prefix cache."""
    from runtime.llm.model import LLM
    from runtime.metrics import peak_rss_bytes

    with LLM.load(model, memory="1G", threads=threads) as llm:
        params = llm.params(temperature=0.0, max_tokens=64)
        # Distinct 1,400-token documents: each prefill saves a prefix state, so the
        # prefix cache fills to its bound, as on a busy device.
        for i in range(4):
            llm.generate(llm.tokenize(_prompt(3000, f"Document {i}: "))[: min(1400, llm.n_ctx - 128)], params)
        plan = llm.plan
        return {
            "planned_bytes": plan.total_bytes,
            "measured_peak_rss_bytes": peak_rss_bytes(),
            "n_ctx": plan.n_ctx,
            "kv_type": plan.kv_type.value,
            "prefix_cache_used_bytes": llm.prefix_cache.bytes,
            "plan": plan.to_dict(),
            "load1": os.getloadavg()[0],
        }


def _spawn(kind: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--worker", kind, *args], capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m-instruct", "gemma3-270m"])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "llm.json"))
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        kind, model, threads, *rest = args.worker
        fn = {
            "speed": lambda: worker_speed(model, int(threads), rest[0]),
            "ttft": lambda: worker_ttft(model, int(threads)),
            "rss": lambda: worker_rss(model, int(threads)),
        }[kind]
        print(json.dumps(fn()))
        return 0

    results = {"machine": {"cpus": os.cpu_count(), "load_at_start": os.getloadavg()}, "rows": []}
    print(f"{'model':<24}{'thr':>4}{'prefill raw':>12}{'edgerun':>9}{'ratio':>7}{'decode raw':>11}{'edgerun':>9}{'ratio':>7}{'load':>6}")
    for model in args.models:
        for threads in args.threads:
            samples = {"raw": [], "edgerun": []}
            for _ in range(args.repeats):
                for engine in ("raw", "edgerun"):  # alternate so drifting load hits both alike
                    samples[engine].append(_spawn("speed", model, str(threads), engine))
            med = {e: {k: statistics.median(s[k] for s in samples[e]) for k in ("prefill_tps", "decode_tps", "load1")} for e in samples}
            row = {
                "model": model,
                "threads": threads,
                "raw": med["raw"],
                "edgerun": med["edgerun"],
                "prefill_ratio": med["edgerun"]["prefill_tps"] / med["raw"]["prefill_tps"],
                "decode_ratio": med["edgerun"]["decode_tps"] / med["raw"]["decode_tps"],
                "samples": samples,
            }
            results["rows"].append(row)
            print(
                f"{model:<24}{threads:>4}{med['raw']['prefill_tps']:>12.1f}{med['edgerun']['prefill_tps']:>9.1f}{row['prefill_ratio']:>7.3f}"
                f"{med['raw']['decode_tps']:>11.1f}{med['edgerun']['decode_tps']:>9.1f}{row['decode_ratio']:>7.3f}{med['edgerun']['load1']:>6.2f}"
            )
    print()
    print(f"{'model':<24}{'cold TTFT ms':>13}{'warm TTFT ms':>13}{'warm/cold':>10}{'source':>8}{'load':>6}")
    results["ttft"] = []
    for model in args.models:
        t = _spawn("ttft", model, str(max(args.threads)))
        t["model"] = model
        results["ttft"].append(t)
        print(f"{model:<24}{t['cold_ttft_ms']:>13.1f}{t['warm_ttft_ms']:>13.1f}{t['ratio']:>10.3f}{t['warm_source']:>8}{t['load1']:>6.2f}")
    print()
    print(f"{'model':<24}{'n_ctx':>6}{'kv':>6}{'planned MiB':>12}{'peak RSS MiB':>13}{'measured/plan':>14}{'load':>6}")
    results["rss"] = []
    for model in args.models:
        r = _spawn("rss", model, str(max(args.threads)))
        r["model"] = model
        r["ratio"] = r["measured_peak_rss_bytes"] / r["planned_bytes"]
        results["rss"].append(r)
        print(
            f"{model:<24}{r['n_ctx']:>6}{r['kv_type']:>6}{r['planned_bytes'] / 2**20:>12.1f}{r['measured_peak_rss_bytes'] / 2**20:>13.1f}"
            f"{r['ratio']:>14.3f}{r['load1']:>6.2f}"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
