"""Serving benchmark: edgerun serve vs llama-cpp-python's server vs llama.cpp's llama-server, same GGUF, same threads.

Each server runs alone (started, measured, stopped) so they never compete for the cores, on a
random loopback port, with the default bundle's weights (SmolLM2-135M-Instruct Q4_1) and
2 threads. At 1, 4 and 8 concurrent streaming clients (``/v1/completions``, 96 tokens,
temperature 0, distinct prompts, ``Cache-Control: no-store``): aggregate tokens/s (every
completion token over the wall time), TTFT p50/p95 and end-to-end p95, through the same client
as ``edgerun loadtest``. edgerun only: urgent-request TTFT p95 idle and while 8 batch-class
streams run (``X-Priority``), and the latency of a result-cache hit. Each server's peak RSS is
read from /proc. Prints a table, writes JSON (bench/results/serve.json) with the machine, its
load average beside every figure, and each server's command line.

    python bench/serve.py [--servers edgerun llama_cpp.server llama-server] [--wait-quiet 600]

llama-server is measured when bench/build_llama_server.sh has built it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from apps.loadtest.client import request_body, request_headers, stream_one  # noqa: E402
from apps.loadtest.run import LoadSpec, arun_load  # noqa: E402
from apps.loadtest.workload import Prompt  # noqa: E402

SERVERS = ("edgerun", "llama_cpp.server", "llama-server")
LEVELS = (1, 4, 8)
TOKENS = 96
THREADS = 2
SLOTS = 4  # edgerun's slots and llama-server's --parallel
SLOT_CTX = 2048
LLAMA_SERVER = Path(os.environ.get("EDGERUN_LLAMA_SERVER_DIR", Path.home() / ".cache/edgerun/llama-server")) / "bin/llama-server"
MODEL_NAME = "bench"  # the model name edgerun serves the GGUF under
START_TIMEOUT_S = 180
MIN_REQUESTS = 4  # per level: 4 one after another at 1 client, one round of N at N clients (N >= 4)

SUBJECTS = ("a lighthouse keeper", "a clockmaker", "a river pilot", "a beekeeper", "a night-shift nurse", "a glassblower",
            "a mountain guide", "a radio operator", "a baker", "a ferry captain", "a librarian", "a welder")
PLACES = ("by the sea", "in the mountains", "in a busy city", "on a small island", "in the desert", "near a forest")


def prompts(n: int, tag: str) -> tuple[Prompt, ...]:
    """``n`` distinct story openings (different from their first words, so no prefix is shared)."""
    return tuple(Prompt(text=f"{tag} {i}. Once upon a time, {SUBJECTS[i % len(SUBJECTS)]} lived "
                             f"{PLACES[i // len(SUBJECTS) % len(PLACES)]}. Every morning")
                 for i in range(n))


def gguf_of(model: str) -> Path:
    from runtime.bundle.resolve import resolve

    return resolve(model).path()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(name: str, gguf: Path, port: int, workdir: Path) -> list[str]:
    if name == "edgerun":
        config = workdir / "serve.toml"
        config.write_text(
            f'host = "127.0.0.1"\nport = {port}\nslots = {SLOTS}\n\n'
            f'[[models]]\nname = "{MODEL_NAME}"\nref = "{gguf}"\npinned = true\nkeep_alive = -1\n'
            f"options = {{ slots = {SLOTS}, ctx = {SLOT_CTX}, threads = {THREADS} }}\n")
        return [sys.executable, "-m", "apps", "serve", "--config", str(config), "--port", str(port)]
    if name == "llama_cpp.server":
        return [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", MODEL_NAME,
                "--n_threads", str(THREADS), "--n_threads_batch", str(THREADS), "--n_ctx", str(SLOT_CTX),
                "--interrupt_requests", "False",  # its default cuts a stream short when the next request comes
                "--host", "127.0.0.1", "--port", str(port)]
    return [str(LLAMA_SERVER), "-m", str(gguf), "--alias", MODEL_NAME, "-t", str(THREADS), "-tb", str(THREADS),
            "--parallel", str(SLOTS), "--cont-batching", "-c", str(SLOTS * SLOT_CTX), "--host", "127.0.0.1",
            "--port", str(port)]


class Server:
    """One server process: started, waited for (GET /v1/models), stopped; its peak RSS read from /proc first."""

    def __init__(self, name: str, argv: list[str], port: int, log: Path):
        self.name, self.argv, self.port, self.log = name, argv, port, log
        self.proc: subprocess.Popen | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(self.argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.tail()}")
            try:
                if httpx.get(self.base + "/v1/models", timeout=2, trust_env=False).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} was not ready within {START_TIMEOUT_S} s: {self.tail()}")

    def tail(self, lines: int = 3) -> str:
        try:
            return " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return ""

    def peak_rss_mib(self) -> float | None:
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        except (OSError, AttributeError):
            pass
        return None

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)  # SIGINT is ignored in a background job started by a shell
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def _p(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


async def levels(base: str, tag: str, counts: tuple[int, ...]) -> dict:
    out = {}
    for n in counts:
        per_client = max(1, math.ceil(MIN_REQUESTS / n))
        spec = LoadSpec(base=base, concurrency=n, duration_s=600, prompts=prompts(n * per_client, f"{tag}-{n}"),
                        max_tokens=TOKENS, temperature=0.0, api="completions", model=MODEL_NAME, requests_per_client=per_client,
                        request_timeout_s=300)
        r = await arun_load(spec)
        out[n] = {"clients": n, "requests": r.requests, "counts": r.counts, "tokens_per_s": r.tokens_per_s,
                  "tokens_per_request": r.tokens / max(1, r.counts["ok"]), "ttft_ms": r.ttft_ms, "e2e_ms": r.e2e_ms,
                  "stream_decode_tps_p50": r.stream_decode_tps_p50, "wall_s": r.wall_s, "load1": r.load1,
                  "errors": r.errors}
        print(f"  {n} clients: {r.tokens_per_s:.1f} tok/s, TTFT p50 {_f(r.ttft_ms['p50'])} ms, counts {r.counts}", flush=True)
    return out


async def urgent_ttft(base: str, client: httpx.AsyncClient, n: int, tag: str) -> list[float]:
    """TTFT (ms) of ``n`` urgent requests sent one after another."""
    times = []
    for i, prompt in enumerate(prompts(n, tag)):
        out = await stream_one(client, base, "completions", request_body("completions", prompt, MODEL_NAME, 8, 0.0),
                               request_headers("urgent"), priority="urgent", timeout_s=120)
        if out.status != "ok" or out.ttft_s is None:
            raise RuntimeError(f"urgent request {i} was {out.status}: {out.error}")
        times.append(out.ttft_s * 1000)
    return times


async def urgent(base: str, n_urgent: int = 8, n_batch: int = 8) -> dict:
    """Urgent TTFT idle, then while ``n_batch`` batch-class streams decode (each restarted when it ends, hung up on
    afterwards)."""
    async with httpx.AsyncClient(trust_env=False, limits=httpx.Limits(max_connections=n_batch + 4)) as client:
        idle = await urgent_ttft(base, client, n_urgent, "idle")

        stop = asyncio.Event()
        ended: list = []

        async def batch(lane: int):  # one batch-class stream at a time, restarted as soon as it ends, until stop
            for k in range(1000):
                prompt = prompts(1, f"batch-{lane}-{k}")[0]
                out = await stream_one(client, base, "completions", request_body("completions", prompt, MODEL_NAME, 512, 0.0),
                                       request_headers("batch"), priority="batch", timeout_s=600)
                ended.append({"status": out.status, "tokens": out.tokens, "error": out.error})
                if stop.is_set():
                    return

        tasks = [asyncio.create_task(batch(i)) for i in range(n_batch)]
        await asyncio.sleep(2.0)  # the batch prompts (~25 tokens each) are prefilled and decoding by then
        load = os.getloadavg()[0]
        busy = await urgent_ttft(base, client, n_urgent, "busy")
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {"idle_ttft_ms": idle, "busy_ttft_ms": busy, "idle_p95_ms": _p(idle, 95), "busy_p95_ms": _p(busy, 95),
            "ratio": _p(busy, 95) / _p(idle, 95), "batch_streams_ended_meanwhile": ended, "load1": load}


def cache_hit(base: str, repeats: int = 8) -> dict:
    """A deterministic whole (non-streamed) request, sent again: the hits' latency, and the miss's."""
    body = {"model": MODEL_NAME, "prompt": "Cache probe. Once upon a time, a cartographer", "max_tokens": TOKENS,
            "temperature": 0.0}
    with httpx.Client(trust_env=False, timeout=120) as client:
        t0 = time.perf_counter()
        first = client.post(base + "/v1/completions", json=body)
        miss_ms = (time.perf_counter() - t0) * 1000
        first.raise_for_status()
        hits, sources = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            r = client.post(base + "/v1/completions", json=body)
            hits.append((time.perf_counter() - t0) * 1000)
            r.raise_for_status()
            sources.append(r.headers.get("x-edgerun-cache", ""))
            if r.json()["choices"][0]["text"] != first.json()["choices"][0]["text"]:
                raise RuntimeError("a cached answer differs from the first")
    return {"miss_ms": miss_ms, "hit_ms": hits, "hit_p50_ms": statistics.median(hits), "hit_max_ms": max(hits),
            "all_hits": all(s == "hit" for s in sources)}


def bench_server(name: str, gguf: Path, workdir: Path, counts: tuple[int, ...]) -> dict:
    port = free_port()
    argv = command(name, gguf, port, workdir)
    server = Server(name, argv, port, workdir / f"{name}.log")
    result: dict = {"argv": argv}
    t0 = time.monotonic()
    try:
        server.start()
        result["start_s"] = time.monotonic() - t0
        warm = LoadSpec(base=server.base, concurrency=1, duration_s=300, prompts=prompts(1, "warm"), max_tokens=8,
                        api="completions", model=MODEL_NAME, requests_per_client=1, request_timeout_s=300)
        asyncio.run(arun_load(warm))
        result["levels"] = asyncio.run(levels(server.base, name, counts))
        if name == "edgerun":
            result["urgent"] = asyncio.run(urgent(server.base))
            result["cache"] = cache_hit(server.base)
        result["peak_rss_mib"] = server.peak_rss_mib()
        result["status"] = "ok"
    except Exception as exc:  # a bench records what failed and goes on to the next server
        result["status"] = f"failed: {type(exc).__name__}: {exc}"
        result["log_tail"] = server.tail(10)
    finally:
        server.stop()
    return result


def wait_quiet(limit_s: float, below: float = 1.0) -> float:
    start = time.monotonic()
    while os.getloadavg()[0] >= below and time.monotonic() - start < limit_s:
        time.sleep(10)
    return os.getloadavg()[0]


def machine() -> dict:
    import llama_cpp

    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return {"cpus": os.cpu_count(), "cpu": cpu, "python": platform.python_version(), "llama_cpp_python": llama_cpp.__version__,
            "commit": commit, "load_at_start": os.getloadavg()}


def _f(v: float | None, fmt: str = ".0f") -> str:
    return "-" if v is None else format(v, fmt)


def table(results: dict) -> list[str]:
    lines = ["| server | clients | tok/s (aggregate) | TTFT p50 ms | TTFT p95 ms | end-to-end p95 ms | tokens/request | load |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in results["servers"].items():
        if r.get("status") != "ok":
            lines.append(f"| {name} | - | {r.get('status', 'not run')} | | | | | |")
            continue
        for n, lv in r["levels"].items():
            lines.append(f"| {name} | {n} | {lv['tokens_per_s']:.1f} | {_f(lv['ttft_ms']['p50'])} | {_f(lv['ttft_ms']['p95'])} | "
                         f"{_f(lv['e2e_ms']['p95'])} | {lv['tokens_per_request']:.0f} | {lv['load1'][1]:.2f} |")
    return lines


def ratios(results: dict) -> dict:
    s = results["servers"]

    def tps(name: str, n: int) -> float | None:
        r = s.get(name, {})
        return r["levels"][n]["tokens_per_s"] if r.get("status") == "ok" and n in r["levels"] else None

    out = {}
    e1, e4 = tps("edgerun", 1), tps("edgerun", 4)
    if e1 and e4:
        out["edgerun_4_vs_1"] = e4 / e1
    for other in ("llama_cpp.server", "llama-server"):
        for n in LEVELS:
            o, e = tps(other, n), tps("edgerun", n)
            if o and e:
                out[f"edgerun_vs_{other}_at_{n}"] = e / o
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", nargs="+", choices=SERVERS, default=["edgerun", "llama-server", "llama_cpp.server"])
    ap.add_argument("--levels", nargs="+", type=int, default=list(LEVELS), metavar="N",
                    help="concurrent clients to measure at (default 1 4 8)")
    ap.add_argument("--model", default="default", help="the bundle whose GGUF every server loads (default: default)")
    ap.add_argument("--wait-quiet", type=float, default=600, metavar="S",
                    help="wait up to S seconds for a load average below 1 before starting (default 600)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "serve.json"))
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds through bench_server's finally: the server stops

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    load = wait_quiet(args.wait_quiet)
    gguf = gguf_of(args.model)
    results: dict = {"machine": machine(), "load_before_start": load, "model": args.model, "gguf": str(gguf),
                     "threads": THREADS, "tokens": TOKENS, "slots": SLOTS, "slot_ctx": SLOT_CTX, "servers": {}}
    with tempfile.TemporaryDirectory(prefix="edgerun-bench-serve-") as tmp:
        for name in args.servers:
            if name == "llama-server" and not LLAMA_SERVER.is_file():
                results["servers"][name] = {"status": f"not built ({LLAMA_SERVER} missing: run bench/build_llama_server.sh)"}
                continue
            print(f"{name}:", flush=True)
            results["servers"][name] = bench_server(name, gguf, Path(tmp), tuple(args.levels))
            results["ratios"] = ratios(results)
            out.write_text(json.dumps(results, indent=2, default=str))  # after each server: a cut-short run keeps them

    print()
    print("\n".join(table(results)))
    e = results["servers"].get("edgerun", {})
    if e.get("status") == "ok":
        u, c = e["urgent"], e["cache"]
        print(f"\nedgerun urgent TTFT p95: idle {u['idle_p95_ms']:.0f} ms, with 8 batch streams {u['busy_p95_ms']:.0f} ms "
              f"({u['ratio']:.2f}x)")
        print(f"edgerun result-cache hit: p50 {c['hit_p50_ms']:.1f} ms, max {c['hit_max_ms']:.1f} ms (miss {c['miss_ms']:.0f} ms)")
    for k, v in results["ratios"].items():
        print(f"{k}: {v:.2f}x")
    print("peak RSS MiB: " + ", ".join(f"{n} {_f(r.get('peak_rss_mib'))}" for n, r in results["servers"].items()))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
