"""The GPU check's speed and placement: edgerun's own path and the raw library, same model, prompt and lengths.

    python scripts/gpu_speed.py --gpu|--dry --model M --out DIR

Runs, each in a fresh process:
1. ``edgerun plan M --json`` (the planner's terms, device and host apart);
2. ``edgerun run M --target gpu --require-accelerator --json`` with a 500-token prompt and 128 greedy tokens, the GPU's
   used memory sampled meanwhile (nvidia-smi); if it dies of a signal (issue 20's crash), once more with llama_cpp
   imported before edgerun, labelled as that workaround, so the offload is still measured; as shipped (speculation
   on: a random model's greedy text repeats, which prompt lookup drafts well) and with --no-speculate (like for like
   with the raw library's decode);
3. the same with ``--target cpu`` (all cores);
4. the raw library as its README shows (``Llama(...)``, ``create_completion``; llama_cpp imported first), all layers
   on the GPU and then ``n_gpu_layers=0``, timed by llama.cpp's own counters (llama_perf_context).
Writes DIR/speed.json and DIR/*.log; prints one line per run. ``--dry``: CPU only (no GPU runs), a check of the script.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPT_TOKENS = 500
GEN_TOKENS = 128
# Issue 20, H200, raw llama-cpp-python 0.3.36 (CUDA, sm_90) on this model shape: 500-token prompt, 128 greedy tokens.
ISSUE_RAW = {"gpu": {"prefill_tps": 1927.0, "decode_tps": 451.5}, "cpu": {"prefill_tps": 1308.0, "decode_tps": 59.4}}

RAW = r"""
import json, sys, time
from llama_cpp import Llama  # first: issue 20's crash follows numpy loaded before llama.cpp
import llama_cpp
model, gpu_layers, threads, prompt_file = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
t0 = time.monotonic()
llm = Llama(model_path=model, n_ctx=2048, n_gpu_layers=gpu_layers, n_threads=threads, n_threads_batch=threads,
            verbose=True)
load_s = time.monotonic() - t0
prompt = open(prompt_file, encoding="utf-8").read()
llm.create_completion(prompt[:200], max_tokens=8, temperature=0.0)  # warm-up
llm.reset()
llama_cpp.llama_perf_context_reset(llm.ctx)
t1 = time.monotonic()
out = llm.create_completion(prompt, max_tokens=128, temperature=0.0)
wall = time.monotonic() - t1
perf = llama_cpp.llama_perf_context(llm.ctx)
print(json.dumps({"load_s": round(load_s, 2), "wall_s": round(wall, 3), "tokens_in": out["usage"]["prompt_tokens"],
                  "tokens_out": out["usage"]["completion_tokens"],
                  "prefill_tps": round(perf.n_p_eval / (perf.t_p_eval_ms / 1e3), 1) if perf.t_p_eval_ms else None,
                  "decode_tps": round(perf.n_eval / (perf.t_eval_ms / 1e3), 1) if perf.t_eval_ms else None,
                  "n_p_eval": perf.n_p_eval, "n_eval": perf.n_eval}))
"""


class GpuMemory:
    """The GPU's used memory sampled every 0.25 s while a run lasts (nvidia-smi): the peak minus the baseline."""

    def __init__(self) -> None:
        self.smi = shutil.which("nvidia-smi")
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _read(self) -> int | None:
        if not self.smi:
            return None
        done = subprocess.run([self.smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True)
        try:
            return int(done.stdout.split()[0]) << 20  # MiB
        except (IndexError, ValueError):
            return None

    def _poll(self) -> None:
        while not self._stop.is_set():
            value = self._read()
            if value is not None:
                self.samples.append(value)
            self._stop.wait(0.25)

    def __enter__(self) -> GpuMemory:
        self.baseline = self._read()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def peak_delta(self) -> int | None:
        if self.baseline is None or not self.samples:
            return None
        return max(self.samples) - self.baseline


def run(cmd: list[str], log: Path, timeout: float, env: dict[str, str] | None = None) -> tuple[int | None, dict, float]:
    t0 = time.monotonic()
    with log.open("w") as f:
        f.write("$ " + " ".join(cmd[:6]) + " ...\n")
        f.flush()
        try:
            done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=f, text=True, timeout=timeout, cwd=ROOT,
                                  env={**os.environ, **(env or {})})
            rc, out = done.returncode, done.stdout
        except subprocess.TimeoutExpired:
            rc, out = None, ""
        f.write("\n--- stdout ---\n" + out[-20000:])
    found = re.findall(r"^\{.*\}$", out, flags=re.M | re.S)
    data: dict = {}
    if found:
        try:
            data = json.loads(found[-1])
        except ValueError:
            data = {}
    return rc, data, time.monotonic() - t0


def outcome(rc: int | None) -> str:
    if rc is None:
        return "timeout"
    return "ok" if rc == 0 else (signal.Signals(-rc).name if rc < 0 else f"exit {rc}")


def layers_line(log: Path) -> str:
    text = log.read_text(errors="replace")
    m = re.findall(r"offloaded \d+/\d+ layers to GPU", text)
    return m[-1] if m else ""


def make_prompt(model: str, out: Path) -> Path:
    """About PROMPT_TOKENS tokens of the repo's README, cut with the model's own tokenizer."""
    from llama_cpp import Llama

    llm = Llama(model_path=model, vocab_only=True, verbose=False)
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    tokens = llm.tokenize(text.encode(), add_bos=False)[:PROMPT_TOKENS]
    prompt = llm.detokenize(tokens).decode("utf-8", errors="ignore")
    path = out / "prompt.txt"
    path.write_text(prompt, encoding="utf-8")
    return path


def edgerun_cmd(model: str, target: str, prompt: str, threads: int | None) -> list[str]:
    cmd = ["-m", "apps", "run", model, "--target", target, "--json", "--prompt", prompt, "--max-tokens", str(GEN_TOKENS),
           "--temperature", "0", "--ctx", "2048", "--memory", "32G"]
    if target == "gpu":
        cmd.append("--require-accelerator")
    if threads:
        cmd += ["--threads", str(threads)]
    return cmd


def save(out: Path, results: dict) -> None:
    (out / "speed.json").write_text(json.dumps(results, indent=1, default=str))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--gpu", action="store_true")
    mode.add_argument("--dry", action="store_true")
    p.add_argument("--model", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--timeout", type=float, default=60)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    prompt = make_prompt(args.model, args.out).read_text(encoding="utf-8")
    threads = os.cpu_count() or 1
    results: dict = {"prompt_tokens": PROMPT_TOKENS, "gen_tokens": GEN_TOKENS, "issue_raw": ISSUE_RAW, "runs": {}}

    rc, plan, _ = run([py, "-m", "apps", "plan", args.model, "--memory", "32G", "--ctx", "2048", "--json"],
                      args.out / "plan.log", args.timeout)
    results["plan"] = plan
    print(f"plan: {outcome(rc)}", flush=True)

    targets = ["cpu"] if args.dry else ["gpu", "cpu"]
    for target, plain in [(t, p) for t in targets for p in (False, True)]:
        # As shipped (speculation on), and plain decoding: like for like with the raw library's decode.
        name = f"edgerun-{target}" + ("-plain" if plain else "")
        cmd = [py, *edgerun_cmd(args.model, target, prompt, threads if target == "cpu" else None)]
        if plain:
            cmd.append("--no-speculate")
        with GpuMemory() as mem:
            rc, data, wall = run(cmd, args.out / f"{name}.log", args.timeout)
        entry = {"result": outcome(rc), "wall_s": round(wall, 1), "gpu_mem_delta_bytes": mem.peak_delta(),
                 "llama_log": layers_line(args.out / f"{name}.log")}
        if rc is not None and rc < 0:
            # Issue 20's crash: measure the offload anyway, with llama_cpp loaded before anything else.
            shim = ["-c", "import llama_cpp, runpy, sys; sys.argv = ['edgerun', *sys.argv[1:]]; "
                          "runpy.run_module('apps', run_name='__main__')", *cmd[3:]]
            with GpuMemory() as mem:
                rc2, data, wall = run([py, *shim], args.out / f"{name}-llama-first.log", args.timeout)
            entry["workaround"] = {"how": "llama_cpp imported before edgerun (not a fix)", "result": outcome(rc2),
                                   "wall_s": round(wall, 1), "gpu_mem_delta_bytes": mem.peak_delta()}
        for key in ("tokens_in", "tokens_out", "prefill_tps", "decode_tps", "ttft_ms", "peak_rss_bytes", "speculation",
                    "placement", "plan"):
            if key in data:
                entry[key] = data[key]
        results["runs"][name] = entry
        save(args.out, results)  # after each run: a step timeout keeps what was measured
        print(f"{name}: {entry['result']} prefill {data.get('prefill_tps')} decode {data.get('decode_tps')}"
              f" {entry.get('placement', {}).get('offload') if isinstance(entry.get('placement'), dict) else ''}", flush=True)

    for target, layers in (("gpu", -1), ("cpu", 0)):
        if args.dry and target == "gpu":
            continue
        name = f"raw-{target}"
        with GpuMemory() as mem:
            rc, data, wall = run([py, "-c", RAW, args.model, str(layers), str(threads), str(args.out / "prompt.txt")],
                                 args.out / f"{name}.log", args.timeout)
        results["runs"][name] = {"result": outcome(rc), **data, "gpu_mem_delta_bytes": mem.peak_delta(),
                                 "llama_log": layers_line(args.out / f"{name}.log")}
        print(f"{name}: {outcome(rc)} prefill {data.get('prefill_tps')} decode {data.get('decode_tps')}", flush=True)
        save(args.out, results)
    print("speed: " + ", ".join(f"{k} {v['result']}" for k, v in results["runs"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
