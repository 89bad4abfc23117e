"""Does a draft model pay? Decode tokens/s of the default bundle with and without its q4_0 self-speculation draft.

In one process (the target and the draft loaded once, the same threads): per prompt, greedy generations plain (no
speculation), with prompt lookup (the default), with the draft model under the adaptive controller (one controller
for all requests, as ``--draft`` gives, and a fresh one per request), and with the draft model forced to draft k
tokens every step (the acceptance rate and the cost, whatever the controller would decide). Repeats are
interleaved and the median is reported, with the load average beside (other processes compete for the cores), and
the CPU time per generated token of the whole request (prefill included, the draft's too): with one thread it is
what the request costs, whatever else runs. Greedy text is compared with the plain run's for every mode. Prints a
table; ``--json`` writes bench/results/draft.json.

    python bench/draft.py [--threads 1] [--tokens 128] [--repeats 3] [--forced 1 2 3 4] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPTS = {  # chat requests: free text (no repetition to look up) and a rewrite of a given text
    "story": "Write a short story about a robot who learns to paint.",
    "explain": "Explain how a refrigerator keeps food cold, step by step.",
    "rewrite": "Rewrite this more formally: the meeting got moved to thursday because half the team is out sick, "
               "so please bring the budget numbers then and tell anyone who missed the email.",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="1: no spinning threads to lose to other processes")
    parser.add_argument("--prompts", nargs="+", choices=list(PROMPTS), default=list(PROMPTS))
    parser.add_argument("--forced", nargs="*", type=int, default=[1, 2, 3, 4], help="forced draft lengths to run")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from converters.llm.draft import make_draft
    from runtime.bundle.resolve import resolve
    from runtime.llm.model import LLM
    from runtime.llm.sampling import SamplingParams
    from runtime.llm.speculative import Adaptive, PromptLookup, Speculator

    class Fixed(Adaptive):
        def __init__(self, k: int) -> None:
            super().__init__()
            self.k = k

        def plan(self, limit: int | None = None) -> int:
            return self.k if limit is None else min(self.k, limit)

    target = resolve("default")
    with tempfile.TemporaryDirectory() as tmp:
        draft = make_draft(target.path(), Path(tmp) / "draft-q4_0.gguf")
        llm = LLM.load(target, memory="1G", ctx=2048, threads=args.threads, draft=str(draft.path))
        shared = Speculator(llm.draft)
        modes = {
            "plain": lambda: None,
            "prompt-lookup (default)": lambda: Speculator(PromptLookup()),
            "draft, adaptive, fresh": lambda: Speculator(llm.draft),
            "draft, adaptive (--draft)": lambda: shared,  # one controller for every request, as LLM.load gives
            **{f"draft, forced k={k}": (lambda k=k: Speculator(llm.draft, Fixed(k))) for k in args.forced},
        }
        params = SamplingParams(temperature=0.0, max_tokens=args.tokens, seed=1)
        runs: dict[tuple[str, str], list[dict]] = {}
        for _ in range(args.repeats):
            for pname in args.prompts:
                prompt = PROMPTS[pname]
                for mode, make in modes.items():
                    llm.speculator = make()
                    llm.kv.clear()  # every run from a cold cache: the same prefill for each mode
                    cpu = time.process_time()
                    result = llm.chat([{"role": "user", "content": prompt}], params).finish()
                    cpu = time.process_time() - cpu
                    runs.setdefault((pname, mode), []).append(
                        {"decode_tps": result.decode_tps, "text": result.text, "tokens": result.tokens_out,
                         "cpu_ms_per_token": 1000 * cpu / max(1, result.tokens_out), "load": os.getloadavg()[0],
                         **result.speculation})
        llm.close()
    rows = []
    for (pname, mode), rs in runs.items():
        plain = runs[(pname, "plain")][0]["text"]
        rows.append({
            "prompt": pname, "mode": mode, "decode_tps": statistics.median(r["decode_tps"] for r in rs),
            "cpu_ms_per_token": statistics.median(r["cpu_ms_per_token"] for r in rs),
            "tokens": rs[0]["tokens"], "acceptance": statistics.median(r.get("acceptance", 0.0) for r in rs),
            "mean_draft": statistics.median(r.get("mean_draft", 0.0) for r in rs),
            "ended_on": [r.get("on") for r in rs], "identical": all(r["text"] == plain for r in rs),
            "load": round(statistics.median(r["load"] for r in rs), 2),
        })
    print(f"decode tokens/s, median of {args.repeats}, {args.threads} threads, {args.tokens} greedy tokens, draft"
          f" {draft.quant.value} {draft.draft_bytes / 2**20:.1f} MiB vs target {draft.target_bytes / 2**20:.1f} MiB")
    print(f"{'prompt':<8} {'mode':<27} {'tok/s':>7} {'vs plain':>8} {'cpu ms/tok':>10} {'accept':>7} {'draft':>6}"
          f" {'same':>5} {'load':>5}")
    for row in rows:
        base = next(r["decode_tps"] for r in rows if r["prompt"] == row["prompt"] and r["mode"] == "plain")
        row["vs_plain"] = row["decode_tps"] / base if base else 0.0
        print(f"{row['prompt']:<8} {row['mode']:<27} {row['decode_tps']:7.1f} {row['vs_plain']:7.2f}x"
              f" {row['cpu_ms_per_token']:10.2f} {row['acceptance']:7.2f} {row['mean_draft']:6.2f}"
              f" {'yes' if row['identical'] else 'NO':>5} {row['load']:5.2f}")
    if args.json:
        out = ROOT / "bench" / "results" / "draft.json"
        out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "threads": args.threads,
                                   "tokens": args.tokens, "repeats": args.repeats, "rows": rows}, indent=2) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
