"""Tool calls as Home Assistant makes them: edgerun serve vs llama.cpp's llama-server, same GGUF, same threads.

The set (bench/home_control.json): Home Assistant 2025.4's Assist API as its Ollama/OpenAI integrations send it,
24 tools (HassTurnOn, HassTurnOff, HassLightSet, HassClimateSetTemperature, timers, GetLiveContext...) with the
schemas HA's voluptuous-openapi conversion gives, a system prompt listing 49 exposed entities in 8 areas, and 74
utterances, each with the call HA would run (and the equally good ones). Each request is what HA sends: the system
prompt, the utterance, the tools, ``tool_choice`` left to the model (auto), greedy, streamed.

Both servers as their users run them: edgerun serve with its defaults (prefix cache on); llama-server built from
the llama.cpp that llama-cpp-python vendors (bench/build_llama_server.sh) with ``--jinja`` (its tool-call support:
the GGUF's template, or its generic JSON format when the template has no tools, grammar-constrained), prompt cache
on (its default), flash attention on (``-fa on``), one slot each, 2 threads. Requests alternate A, B, A, B over
every case once (accuracy: greedy, so a pass is the answer), then ``--repeats`` passes in all over the first
``--timing-cases`` cases; time ratios are the median of per-pair ratios with their spread. ``max_tokens`` is 150,
Home Assistant's OpenAI integration's default.

Reported per server: schema-valid calls (a call whose name is a tool and whose arguments validate, jsonschema),
answers that are not calls, exact-match calls (the first call equals the expected one or an also-accepted one:
strings compared without case, 21 == 21.0), TTFT and time to a complete call (p50/p95), and edgerun's grammar cost
per decoded token (the same requests' decode rate with and without the tool grammar, single stream).

    python bench/tools.py [--repeats 5] [--cases 74] [--servers edgerun llama-server] [--model default]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.serve import LLAMA_SERVER, Server, free_port, gguf_of  # noqa: E402

DATA = ROOT / "bench" / "home_control.json"
OUT = ROOT / "bench" / "results" / "tools.json"
THREADS = 2
CTX = 8192
MAX_TOKENS = 150  # Home Assistant's OpenAI integration's default (RECOMMENDED_MAX_TOKENS)
NAME = "bench"


def command(name: str, gguf: Path, port: int, workdir: Path) -> list[str]:
    if name == "edgerun":
        config = workdir / "serve.toml"
        config.write_text(f'host = "127.0.0.1"\nport = {port}\nslots = 1\n\n[[models]]\nname = "{NAME}"\nref = "{gguf}"\n'
                          f"pinned = true\nkeep_alive = -1\noptions = {{ slots = 1, ctx = {CTX}, threads = {THREADS} }}\n")
        return [sys.executable, "-m", "apps", "serve", "--config", str(config), "--port", str(port)]
    return [str(LLAMA_SERVER), "-m", str(gguf), "--alias", NAME, "-t", str(THREADS), "-tb", str(THREADS), "--jinja",
            "-fa", "on", "--parallel", "1", "-c", str(CTX), "--host", "127.0.0.1", "--port", str(port)]


def _same(a: object, b: object) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return a.strip().casefold() == b.strip().casefold()
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def judge(calls: list[dict], case: dict, schemas: dict[str, dict]) -> dict:
    """Schema-validity of every call and exact match of the first against the case's expected calls."""
    import jsonschema

    valid = bool(calls)
    parsed = []
    for call in calls:
        try:
            args = json.loads(call["arguments"])
            jsonschema.validate(args, schemas[call["name"]])
            parsed.append((call["name"], args))
        except (KeyError, ValueError, jsonschema.ValidationError):
            valid = False
    good = [case["expected"], *case.get("also", [])]
    exact = valid and bool(parsed) and any(parsed[0][0] == g["name"] and _same(parsed[0][1], g["arguments"]) for g in good)
    return {"call": bool(calls), "valid": valid, "exact": exact}


def ask(client: httpx.Client, base: str, data: dict, utterance: str, choice: str = "auto") -> dict:
    """One streamed request as HA sends it (``choice``: its tool_choice; HA leaves it to the model, auto): calls,
    text, TTFT s, time to the whole answer s, decoded tokens."""
    body = {"model": NAME, "stream": True, "temperature": 0, "max_tokens": MAX_TOKENS, "tools": data["tools"],
            "tool_choice": choice,
            "messages": [{"role": "system", "content": data["system_prompt"]}, {"role": "user", "content": utterance}],
            "stream_options": {"include_usage": True}}
    calls: dict[int, dict] = {}
    text, ttft, tokens, finish = "", None, 0, None
    t0 = time.perf_counter()
    # a fresh connection each time: llama-server drops a keep-alive connection left idle while the other one answers
    with client.stream("POST", base + "/v1/chat/completions", json=body,
                       headers={"Cache-Control": "no-store", "Connection": "close"}, timeout=600) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"].get("completion_tokens", 0)
            for choice in chunk.get("choices", []):
                delta = choice.get("delta", {})
                if (delta.get("content") or delta.get("tool_calls")) and ttft is None:
                    ttft = time.perf_counter() - t0
                text += delta.get("content") or ""
                for d in delta.get("tool_calls") or ():
                    call = calls.setdefault(d.get("index", 0), {"name": "", "arguments": ""})
                    fn = d.get("function") or {}
                    call["name"] += fn.get("name") or ""
                    call["arguments"] += fn.get("arguments") or ""
                finish = choice.get("finish_reason") or finish
    total = time.perf_counter() - t0
    return {"calls": [calls[i] for i in sorted(calls)], "text": text, "ttft_s": ttft or total, "total_s": total,
            "tokens": tokens, "finish": finish}


def _p(values: list[float], q: float) -> float | None:
    from runtime.metrics import percentile

    return percentile(values, q, method="linear") if values else None


def grammar_cost(model: str, data: dict, cases: list[dict]) -> dict:
    """edgerun's decode rate on the same requests with the tool grammar and without it (single stream, greedy):
    per decoded token, constrained / unconstrained, per case, paired."""
    from runtime.llm.model import LLM
    from runtime.llm.tools import Tools, tool_messages

    tools = Tools.parse(data["tools"])
    ratios = []
    with LLM.load(model, threads=THREADS, ctx=CTX) as llm:
        for case in cases:
            messages = tool_messages([{"role": "system", "content": data["system_prompt"]},
                                      {"role": "user", "content": case["utterance"]}], tools)
            free = llm.chat(messages, llm.params(temperature=0.0, max_tokens=48)).finish()  # warms the prefix
            tokens = free.tokens_out
            per = []
            for grammar in (tools.grammar(), None):
                gen = llm.chat(messages, llm.params(temperature=0.0, max_tokens=tokens or 48, grammar=grammar))
                result = gen.finish()
                per.append(1.0 / result.decode_tps if result.decode_tps else float("nan"))
            if all(math.isfinite(x) for x in per):
                ratios.append(per[0] / per[1])
    return {"ratio_median": statistics.median(ratios) if ratios else None,
            "ratio_min": min(ratios, default=None), "ratio_max": max(ratios, default=None), "pairs": len(ratios)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--servers", nargs="+", default=["edgerun", "llama-server"])
    ap.add_argument("--repeats", type=int, default=5, help="passes over the timing cases (the first pass: all cases)")
    ap.add_argument("--timing-cases", type=int, default=12, help="cases the later passes repeat, for paired timings")
    ap.add_argument("--cases", type=int, default=None, help="the first N cases only (a quick look)")
    ap.add_argument("--no-grammar-cost", action="store_true")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()

    data = json.loads(DATA.read_text())
    cases = data["cases"][: args.cases] if args.cases else data["cases"]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in data["tools"]}
    servers = [s for s in args.servers if s != "llama-server" or LLAMA_SERVER.exists()]
    if servers != args.servers:
        print("llama-server is not built (bash bench/build_llama_server.sh): measuring edgerun alone", flush=True)
    gguf = gguf_of(args.model)
    rows: dict[str, list[dict]] = {s: [] for s in servers}
    with tempfile.TemporaryDirectory() as tmp:
        running = {}
        try:
            for name in servers:
                port = free_port()
                work = Path(tmp) / name
                work.mkdir()
                running[name] = Server(name, command(name, gguf, port, work), port, work / "log.txt")
                running[name].start()
            with httpx.Client(trust_env=False) as client:
                for srv in running.values():  # warm: the system prompt and tools into each prompt cache
                    ask(client, srv.base, data, cases[0]["utterance"])
                # auto (what HA sends) once over every case; required (a call forced: the arguments' quality
                # and the time to a whole call, on both sides) over every case, then repeated on the timing cases
                passes = [("auto", cases)] + [("required", cases if rep == 0 else cases[: args.timing_cases])
                                              for rep in range(args.repeats)]
                for rep, (choice, todo) in enumerate(passes):
                    for i, case in enumerate(todo):
                        order = list(running.items()) if (rep + i) % 2 == 0 else list(running.items())[::-1]
                        for name, srv in order:  # A, B then B, A: neither always goes first
                            try:
                                out = ask(client, srv.base, data, case["utterance"], choice)
                            except httpx.HTTPError as exc:
                                raise RuntimeError(f"{name} failed on case {i} ({choice}): {exc}; log: {srv.tail(8)}") from None
                            rows[name].append({"rep": rep, "choice": choice, "case": i, **out,
                                               **judge(out["calls"], case, schemas)})
                    print(f"  pass {rep + 1}/{len(passes)} ({choice}) done", flush=True)
        finally:
            for srv in running.values():
                srv.stop()

    summary: dict[str, dict] = {}
    for name, got in rows.items():
        for choice, rep in (("auto", 0), ("required", 1)):
            first = [r for r in got if r["rep"] == rep]
            called = [r for r in first if r["call"]]
            timed = [r for r in got if r["choice"] == choice and r["case"] < args.timing_cases]
            timed_calls = [r["total_s"] * 1000 for r in timed if r["call"]]
            summary[f"{name} {choice}"] = {
                "cases": len(first), "calls": len(called),
                "schema_valid_pct": 100.0 * sum(r["valid"] for r in called) / len(called) if called else None,
                "exact_pct": 100.0 * sum(r["exact"] for r in first) / len(first) if first else None,
                "ttft_ms": {"p50": _p([r["ttft_s"] * 1000 for r in timed], 50),
                            "p95": _p([r["ttft_s"] * 1000 for r in timed], 95)},
                "call_ms": {"p50": _p(timed_calls, 50), "p95": _p(timed_calls, 95)},
                "stable_across_repeats": all(r["calls"] == next(x["calls"] for x in first if x["case"] == r["case"])
                                             for r in timed if r["rep"] > rep),
            }
    pairs = {}
    if len(rows) == 2:
        a, b = list(rows)
        for key in ("ttft_s", "total_s"):  # required passes on the timing cases: a call on both sides
            ratios = [x[key] / y[key] for x, y in zip(rows[a], rows[b], strict=True)
                      if y[key] > 0 and x["choice"] == "required" and x["case"] < args.timing_cases]
            if ratios:
                pairs[key] = {"ratio": f"{a}/{b}", "median": statistics.median(ratios), "min": min(ratios),
                              "max": max(ratios), "pairs": len(ratios)}
    cost = None if args.no_grammar_cost else grammar_cost(args.model, data, cases[: min(len(cases), 20)])
    report = {"model": args.model, "gguf": str(gguf), "threads": THREADS, "ctx": CTX, "repeats": args.repeats,
              "machine": {"cpu": platform.processor() or platform.machine(), "cores": __import__("os").cpu_count(),
                          "load1_start": __import__("os").getloadavg()[0]},
              "servers": summary, "paired": pairs, "grammar_cost": cost, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))

    print(f"\nTool calls, {len(cases)} Home Assistant utterances x {args.repeats}, {args.model}, {THREADS} threads")
    print(f"{'server, tool_choice':<24}{'calls':>7}{'valid %':>9}{'exact %':>9}{'TTFT p50':>10}{'p95':>8}{'call p50':>10}{'p95':>8}")
    for name, s in summary.items():
        def f(v):
            return "-" if v is None else f"{v:.0f}"
        print(f"{name:<24}{s['calls']:>7}{f(s['schema_valid_pct']):>9}{f(s['exact_pct']):>9}{f(s['ttft_ms']['p50']):>10}"
              f"{f(s['ttft_ms']['p95']):>8}{f(s['call_ms']['p50']):>10}{f(s['call_ms']['p95']):>8}")
    for key, p in pairs.items():
        print(f"{key} {p['ratio']}: median {p['median']:.3f} ({p['min']:.3f}-{p['max']:.3f}, {p['pairs']} pairs)")
    if cost:
        print(f"grammar cost per decoded token (constrained/free): median {cost['ratio_median']:.3f} "
              f"({cost['ratio_min']:.3f}-{cost['ratio_max']:.3f}, {cost['pairs']} cases)")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
