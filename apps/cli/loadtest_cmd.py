"""``edgerun loadtest URL``: N streaming clients for S seconds against a server on this machine.

Prints TTFT and end-to-end latency p50/p95/p99, aggregate decode tokens/s and the count of
each outcome; with ``--target-ttft-p95`` it searches the highest concurrency (up to
``--concurrency``) that meets it, and exits 1 when not even one client does.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from apps.cli.common import print_json
from apps.cli.flags import integer, number, sampling_value
from runtime.errors import BadInput

HELP = "load-test an OpenAI-compatible server on loopback: TTFT and latency percentiles, tokens/s, 429s; capacity search"
MAX_CONCURRENCY = 1024  # clients in one process; far past what a small board serves
MAX_KEY_BYTES = 4096


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from apps.loadtest.run import MAX_REQUESTS

    parser.add_argument("url", help="the server's root on this machine, e.g. http://127.0.0.1:8080 (loopback only)")
    parser.add_argument("--concurrency", type=integer(1, MAX_CONCURRENCY), default=4, metavar="N",
                        help="concurrent clients; with --target-ttft-p95, the most to try (default 4)")
    parser.add_argument("--duration", type=number(0.1, 3600, "seconds"), default=10.0, metavar="S",
                        help="seconds per timed run (default 10)")
    parser.add_argument("--prompts", metavar="FILE", help="one prompt per line, or JSON Lines with prompt/messages (default: built in)")
    parser.add_argument("--priority-mix", default="interactive=1", metavar="MIX",
                        help="share of each priority, e.g. urgent=0.1,interactive=0.6,batch=0.3 (default interactive=1)")
    parser.add_argument("--max-tokens", type=sampling_value("max_tokens"), default=96, metavar="N",
                        help="tokens per completion at most (default 96)")
    parser.add_argument("--temperature", type=sampling_value("temperature"), default=0.0, metavar="T", help="(default 0)")
    parser.add_argument("--api", choices=("chat", "completions"), default="chat", help="which endpoint (default chat)")
    parser.add_argument("--model", help="the model name to send (default: the first the server lists)")
    parser.add_argument("--api-key-file", metavar="FILE", help="a file holding the API key (sent as a bearer token)")
    parser.add_argument("--timeout", type=number(0.1, 3600, "seconds"), default=120.0, metavar="S",
                        help="this client's limit per request (default 120)")
    parser.add_argument("--deadline-ms", type=integer(1, 86_400_000, "one day"), metavar="MS",
                        help="ask the server to give up on each request after MS (X-Deadline-Ms; edgerun answers 504)")
    parser.add_argument("--max-requests", type=integer(1, MAX_REQUESTS), default=MAX_REQUESTS, metavar="N",
                        help=f"requests per timed run at most (default {MAX_REQUESTS})")
    parser.add_argument("--target-ttft-p95", type=number(0.001, 3600, "seconds"), metavar="S",
                        help="find the highest concurrency whose TTFT p95 is within S seconds with every request answered")
    parser.add_argument("--use-cache", action="store_true", help="let the server's result cache answer (default: Cache-Control: no-store)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def _api_key(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        with Path(path).open("rb") as f:
            raw = f.read(MAX_KEY_BYTES + 1)
    except OSError as exc:
        raise BadInput(f"--api-key-file {path}: cannot read it ({exc.strerror or exc})") from None
    key = raw.decode("utf-8", "replace").strip()
    if len(raw) > MAX_KEY_BYTES or not key or any(c.isspace() or not c.isprintable() for c in key):
        raise BadInput(f"--api-key-file {path}: not one key: give a file holding one printable token of at most {MAX_KEY_BYTES} bytes")
    return key


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _print_report(r, base: str, duration: float) -> None:
    c = r.counts
    print(f"loadtest {base} model {r.model}: {r.concurrency} clients, {duration:g} s ({r.api}), {r.wall_s:.1f} s wall")
    print(f"  requests     {r.requests}: ok {c['ok']}, 429 {c['rejected']}, 504 {c['timeout']}, "
          f"errors {c['error']}, hung up {c['disconnected']}")
    print(f"  TTFT ms      p50 {_ms(r.ttft_ms['p50'])}  p95 {_ms(r.ttft_ms['p95'])}  p99 {_ms(r.ttft_ms['p99'])}")
    print(f"  end-to-end   p50 {_ms(r.e2e_ms['p50'])}  p95 {_ms(r.e2e_ms['p95'])}  p99 {_ms(r.e2e_ms['p99'])}")
    per_stream = "-" if r.stream_decode_tps_p50 is None else f"{r.stream_decode_tps_p50:.1f}"
    print(f"  decode       {r.tokens_per_s:.1f} tok/s aggregate ({r.tokens} tokens), {per_stream} tok/s per stream (p50)")
    for name, p in r.by_priority.items():
        print(f"  {name:<12} {p['requests']} requests, TTFT p95 {_ms(p['ttft_ms']['p95'])} ms, "
              f"end-to-end p95 {_ms(p['e2e_ms']['p95'])} ms")
    for line, count in r.errors.items():
        print(f"  error x{count}: {line}")
    print(f"  load average {r.load1[0]:.2f} -> {r.load1[1]:.2f}")


def main(args: argparse.Namespace) -> int:
    from apps.loadtest.run import LoadSpec, find_capacity, run_load
    from apps.loadtest.target import loopback_base
    from apps.loadtest.workload import load_prompts, parse_mix

    base = loopback_base(args.url)
    spec = LoadSpec(base=base, concurrency=args.concurrency, duration_s=args.duration, prompts=load_prompts(args.prompts),
                    mix=parse_mix(args.priority_mix), max_tokens=args.max_tokens, temperature=args.temperature,
                    api=args.api, model=args.model, api_key=_api_key(args.api_key_file), use_cache=args.use_cache,
                    request_timeout_s=args.timeout, max_requests=args.max_requests, deadline_ms=args.deadline_ms)
    if args.target_ttft_p95 is None:
        report = run_load(spec)
        if args.json:
            print_json({"url": base, **report.to_dict()})
        else:
            _print_report(report, base, args.duration)
        return 0
    cap = find_capacity(spec, args.target_ttft_p95)
    if args.json:
        print_json({"url": base, **cap.to_dict()})
    else:
        print(f"capacity for TTFT p95 <= {args.target_ttft_p95:g} s with every request answered: "
              f"{cap.best or 'none'} (searched 1 to {args.concurrency})")
        print(f"  {'clients':>7} {'TTFT p95 ms':>11} {'tok/s':>7} {'ok':>5} {'429':>5} {'504':>5} {'err':>5}  met")
        for s in cap.steps:
            c = s["counts"]
            print(f"  {s['concurrency']:>7} {_ms(s['ttft_p95_ms']):>11} {s['tokens_per_s']:>7.1f} {c['ok']:>5} "
                  f"{c['rejected']:>5} {c['timeout']:>5} {c['error']:>5}  {'yes' if s['met'] else 'no'}")
        if cap.report is not None:
            _print_report(cap.report, base, args.duration)
    return 0 if cap.best else 1
