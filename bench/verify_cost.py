"""What a speculative verify batch costs: the time of one decode of n tokens (logits at every row) against one plain
decoding step, per GGUF, through edgerun's own backend (the kernels speculation uses).

Speculation with k drafted tokens decodes k + 1 tokens in one batch; it pays when the tokens it expects to keep,
(1 - a^(k+1)) / (1 - a) at acceptance a, exceed that batch's cost in plain steps. llama.cpp's CPU kernels for a
batch differ by weight type (some are repacked for several rows at once, some run row by row), so the cost of a
batch decides where speculation can pay on a machine, before any drafting. For each GGUF: the model is loaded
once, a context of ``--position`` tokens is decoded, then batches of each size are decoded after it and removed,
``--repeats`` times interleaved; the median time is reported, and the break-even acceptance for each size (the
acceptance at which a draft of n - 1 tokens keeps as many tokens as the batch costs in steps).

    python bench/verify_cost.py [MODEL ...] [--sizes 1 2 3 5 9] [--threads 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from runtime.errors import BadInput, EdgerunError  # noqa: E402 - after the path set-up above
from runtime.llm.speculative import expected_tokens  # noqa: E402


def break_even(cost_steps: float, k: int) -> float | None:
    """The acceptance at which a k-token draft keeps ``cost_steps`` tokens per batch; None when even 1.0 cannot."""
    if k == 0 or cost_steps <= 1.0:
        return 0.0
    if expected_tokens(1.0, k) < cost_steps:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, k) < cost_steps else (lo, mid)
    return hi


def measure(model: str, sizes: list[int], position: int, repeats: int, threads: int) -> dict:
    from runtime.llm.model import LLM

    with LLM.load(model, ctx=max(1024, position + max(sizes) + 8), threads=threads, speculate=False,
                  prefix_cache_bytes=0) as llm:
        backend = llm.backend
        text = ("The lighthouse keeper wrote in the log every night, the wind, the ships, the lamp. " * 64)
        context = backend.tokenize(text, add_bos=True, special=False)[:position]
        backend.clear()
        backend.decode(context, 0)
        times: dict[int, list[float]] = {n: [] for n in sizes}
        for _ in range(repeats):
            for n in sizes:
                batch = context[-n:]
                t0 = time.perf_counter()
                backend.decode(batch, position, logits_all=n > 1)
                times[n].append(time.perf_counter() - t0)
                backend.remove(position)
        step = statistics.median(times[1]) if 1 in times else None
        rows = []
        for n in sizes:
            ms = statistics.median(times[n]) * 1000
            cost = ms / (step * 1000) if step else None
            rows.append({"tokens": n, "ms": ms, "steps": cost, "break_even_acceptance": break_even(cost, n - 1) if cost else None})
        return {"model": llm.model.manifest.ref, "path": str(llm.model.path()), "threads": llm.placement.threads,
                "position": position, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=["default"], help="bundles, .gguf files or installed names (default: default)")
    ap.add_argument("--sizes", nargs="+", type=int, default=[1, 2, 3, 5, 9], help="batch sizes (tokens) to time")
    ap.add_argument("--position", type=int, default=512, help="context tokens before each batch (default 512)")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, nargs="?", const=ROOT / "bench" / "results" / "verify_cost.json")
    args = ap.parse_args(argv)
    try:
        for flag, value in (("--position", args.position), ("--repeats", args.repeats), ("--threads", args.threads),
                            *(("--sizes", n) for n in args.sizes)):
            if value < 1:
                raise BadInput(f"{flag} must be a positive integer, got {value}")
        if 1 not in args.sizes:
            args.sizes = [1, *args.sizes]  # the plain step every cost is relative to
        load = os.getloadavg()
        results = [measure(m, sorted(set(args.sizes)), args.position, args.repeats, args.threads) for m in args.models]
    except EdgerunError as exc:
        print(f"verify_cost: {exc}", file=sys.stderr)
        return exc.exit_code
    print(f"verify batch cost, {args.threads} thread(s), after {args.position} context tokens, median of {args.repeats}; "
          f"load {load[0]:.2f} at start, {os.getloadavg()[0]:.2f} at end")
    print(f"{'model':<44}{'tokens':>7}{'ms':>9}{'steps':>8}{'break-even acceptance':>23}")
    for r in results:
        for row in r["rows"]:
            be = row["break_even_acceptance"]
            shown = "-" if row["tokens"] == 1 else ("never" if be is None else f"{be:.2f}")
            print(f"{r['model'][:43]:<44}{row['tokens']:>7}{row['ms']:>9.1f}{row['steps']:>8.2f}{shown:>23}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"load_start": load, "load_end": os.getloadavg(), "threads": args.threads,
                                         "results": results}, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
