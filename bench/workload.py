"""Multi-turn workload: edgerun against raw llama-cpp-python used as its README shows, same GGUF and threads.

Replays the committed sessions in bench/workload/ (one JSON file each; every one starts from the shared
system prompt bench/workload/system.txt): multi-turn chats whose later turns refer back to earlier answers,
"summarize/rewrite this text" over texts that ship in the repo or in installed packages (each named with its
file, license and the sha256 of the excerpt, checked before anything runs), and code edits of functions from
this repo. Each request carries the full history of its session, the assistant turns being the side's own
earlier answers; greedy (temperature 0, repeat penalty 1: the raw library's default), max_tokens per turn as
the session gives it.

Two sides, each in its own fresh process (so its peak RSS is its own), one after the other, never at once:
  edgerun  runtime.llm.model.LLM.chat (prefix cache, chat KV reuse, speculation where the LLM has it, thread choice
           as edgerun makes it);
  raw      llama_cpp.Llama(model_path=..., n_ctx=...) and create_chat_completion(messages=..., temperature=0,
           max_tokens=..., stream=True) per turn, as llama-cpp-python's README shows (streamed to time the first
           token), given the thread count edgerun chose.
Two orders: "sequential" (sessions one after another) and "interleaved" (round-robin: several household users
sharing one box, turn 1 of every session, then turn 2, ...).

Per side: effective tokens/s (generated tokens / wall time from request to last token, summed over the turns),
time to first token (request to first text) p50/p95, peak RSS (VmHWM); the ratio edgerun/raw; whether the greedy
text is identical per turn (mismatches counted, the first shown). Raw's generated tokens: max_tokens when it
stopped for length, else its answer's tokens (its stream reports no usage). Prints a table and writes
bench/results/workload.json with the machine, its load, the date and the versions.

    .venv/bin/python bench/workload.py [--model default] [--ctx 4096] [--threads N] [--orders sequential interleaved]

--ablate adds a third side, "edgerun-plain": edgerun with speculation off (--no-speculate's edgerun), so that what
speculation itself gives or costs is measured in the same run as the rest. --repeats N replays each side N times,
the sides taking turns (edgerun, raw, edgerun-plain, edgerun, ...) so that a change in the machine's load falls on
every side alike; each side's figures are from its run with the median effective tokens/s, and every run's figure is
kept in the JSON.

A control run per order, raw with flash_attn=True (edgerun runs flash attention; the raw library's default does
not), checks the greedy text against the same attention kernel: floating-point sums in another order can flip a
near-tie between two tokens, and the control tells that from a mistake. --no-control skips it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: bench/ is not a package
    sys.path.insert(0, str(ROOT))

from runtime.errors import BadInput, EdgerunError  # noqa: E402 - after the path set-up above

WORKLOAD_DIR = ROOT / "bench" / "workload"
ORDERS = ("sequential", "interleaved")
SIDES = ("edgerun", "raw")
TARGET = 1.5  # issue 20: edgerun at 1.5x raw effective tokens/s
PLAIN = "edgerun-plain"  # edgerun with speculation off (--ablate): what speculation itself gives, in the same run
CONTROL = "raw-fa"  # raw with flash_attn=True: greedy text checked against it too (not a speed side)
SESSION_KEYS = {"name", "kind", "about", "system", "max_tokens", "turns"}
KINDS = ("chat", "summarize", "rewrite", "code")
MAX_TURN_TOKENS = 512  # "bounded max_tokens per turn": the whole bench stays ~10 minutes on 2 cores


@dataclass(frozen=True)
class Session:
    name: str
    kind: str
    system: str
    turns: tuple[str, ...]  # the user messages, texts filled in
    max_tokens: tuple[int, ...]  # per turn
    sources: tuple[dict[str, Any], ...]  # where each filled-in text comes from (file, license, sha256)


def _fail(where: str, problem: str) -> BadInput:
    return BadInput(f"{where}: {problem}")


def _excerpt(text: str, lines: Any, where: str) -> str:
    if lines is None:
        return text.strip()
    if not (isinstance(lines, list) and len(lines) == 2 and all(isinstance(n, int) and n >= 1 for n in lines)
            and lines[0] <= lines[1]):
        raise _fail(where, f"'lines' must be [first, last], 1-based with first <= last, got {lines!r}")
    all_lines = text.splitlines()
    if lines[1] > len(all_lines):
        raise _fail(where, f"'lines' {lines} goes past the file's {len(all_lines)} lines")
    return "\n".join(all_lines[lines[0] - 1 : lines[1]]).strip()


def _source_text(src: Any, where: str) -> str:
    """The text a turn's ``text`` names: inline (code copied with its origin), a repo file, or a package's file."""
    if not isinstance(src, dict) or not isinstance(src.get("license"), str):
        raise _fail(where, "'text' must be an object with a 'license' and one of 'inline', 'repo' or 'package'")
    if "inline" in src:
        if not isinstance(src["inline"], str) or not src["inline"] or not isinstance(src.get("origin"), str):
            raise _fail(where, "an inline text needs non-empty 'inline' text and its 'origin'")
        return src["inline"]
    if "repo" in src:
        path = (ROOT / str(src["repo"])).resolve()
        if ROOT not in path.parents or not path.is_file():
            raise _fail(where, f"repo file {src['repo']!r} is not a file in {ROOT}")
        text = _excerpt(path.read_text(encoding="utf-8"), src.get("lines"), where)
    elif "package" in src:
        try:
            dist = metadata.distribution(str(src["package"]))
        except metadata.PackageNotFoundError:
            raise _fail(where, f"package {src['package']!r} is not installed (its file {src.get('path')!r} is the text)") from None
        entry = next((f for f in dist.files or () if str(f) == src.get("path")), None)
        if entry is None:
            raise _fail(where, f"package {src['package']} {dist.version} has no file {src.get('path')!r}")
        text = _excerpt(entry.read_text(encoding="utf-8"), src.get("lines"), where)
    else:
        raise _fail(where, "'text' must have one of 'inline', 'repo' or 'package'")
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if digest != src.get("sha256"):
        name = src.get("repo") or f"{src['package']}'s {src['path']}"
        raise _fail(where, f"the excerpt of {name} has sha256 {digest[:12]}..., the session expects "
                           f"{str(src.get('sha256'))[:12]}...: the file changed, so this is no longer the same workload")
    return text


def parse_session(data: Any, where: str, directory: Path) -> Session:
    if not isinstance(data, dict):
        raise _fail(where, f"a session is a JSON object with {', '.join(sorted(SESSION_KEYS))}")
    unknown = set(data) - SESSION_KEYS
    if unknown:
        raise _fail(where, f"unknown keys {sorted(unknown)} (valid: {', '.join(sorted(SESSION_KEYS))})")
    name, kind = data.get("name"), data.get("kind")
    if not isinstance(name, str) or not name:
        raise _fail(where, "'name' must be non-empty text")
    if kind not in KINDS:
        raise _fail(where, f"'kind' must be one of {', '.join(KINDS)}, got {kind!r}")
    system = data.get("system")
    if not (isinstance(system, dict) and set(system) == {"shared"} and isinstance(system["shared"], str)):
        raise _fail(where, "'system' must be {\"shared\": FILE}, a system prompt file in the workload folder")
    system_path = directory / system["shared"]
    if system_path.parent != directory or not system_path.is_file():
        raise _fail(where, f"system prompt file {system['shared']!r} is not in {directory}")
    default_max = data.get("max_tokens")
    turns, limits, sources = [], [], []
    raw_turns = data.get("turns")
    if not isinstance(raw_turns, list) or not raw_turns:
        raise _fail(where, "'turns' must be a non-empty list of {\"user\": TEXT}")
    for i, turn in enumerate(raw_turns, 1):
        at = f"{where} turn {i}"
        if not isinstance(turn, dict) or not isinstance(turn.get("user"), str) or not turn["user"].strip():
            raise _fail(at, "a turn must be {\"user\": TEXT} (optional 'text' and 'max_tokens')")
        if set(turn) - {"user", "text", "max_tokens"}:
            raise _fail(at, f"unknown keys {sorted(set(turn) - {'user', 'text', 'max_tokens'})} (valid: user, text, max_tokens)")
        limit = turn.get("max_tokens", default_max)
        if not (isinstance(limit, int) and not isinstance(limit, bool) and 1 <= limit <= MAX_TURN_TOKENS):
            raise _fail(at, f"max_tokens (of the turn or the session) must be an integer from 1 to {MAX_TURN_TOKENS}, got {limit!r}")
        user = turn["user"]
        if "text" in turn:
            if "{text}" not in user:
                raise _fail(at, "a turn with a 'text' must place it with {text} in 'user'")
            user = user.replace("{text}", _source_text(turn["text"], at))
            sources.append({"turn": i, **{k: v for k, v in turn["text"].items() if k != "inline"}})
        elif "{text}" in user:
            raise _fail(at, "'user' has {text} but the turn names no 'text'")
        turns.append(user)
        limits.append(limit)
    return Session(name, kind, system_path.read_text(encoding="utf-8").strip(), tuple(turns), tuple(limits), tuple(sources))


def load_sessions(directory: Path = WORKLOAD_DIR, names: list[str] | None = None) -> list[Session]:
    """Every session file (``*.json``) in ``directory``, sorted by file name; ``names`` picks some (in that order)."""
    files = sorted(directory.glob("*.json"))
    if not files:
        raise BadInput(f"no session files (*.json) in {directory}")
    sessions = []
    for path in files:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise _fail(path.name, f"not valid JSON ({exc})") from None
        sessions.append(parse_session(data, path.name, directory))
    seen = [s.name for s in sessions]
    dupes = sorted({n for n in seen if seen.count(n) > 1})
    if dupes:
        raise BadInput(f"session names must be unique; repeated: {', '.join(dupes)}")
    systems = {s.system for s in sessions}
    if len(systems) > 1:
        raise BadInput("the sessions must share one system prompt; they name different files")
    if names:
        missing = [n for n in names if n not in seen]
        if missing:
            raise BadInput(f"no session named {', '.join(missing)} (have: {', '.join(seen)})")
        sessions = [sessions[seen.index(n)] for n in names]
    return sessions


def schedule(sessions: list[Session], order: str) -> list[tuple[int, int]]:
    """(session index, turn index) in replay order."""
    if order == "sequential":
        return [(s, t) for s, session in enumerate(sessions) for t in range(len(session.turns))]
    if order == "interleaved":
        longest = max(len(s.turns) for s in sessions)
        return [(s, t) for t in range(longest) for s, session in enumerate(sessions) if t < len(session.turns)]
    raise BadInput(f"order must be one of {', '.join(ORDERS)}, got {order!r}")


# -- the two sides, each run in its own process -------------------------------------------------------------------

def _replay(sessions: list[Session], order: str, ask: Any) -> list[dict[str, Any]]:
    """Replay the sessions in ``order``; ``ask(messages, max_tokens)`` yields text pieces, then returns its info."""
    histories = [[{"role": "system", "content": s.system}] for s in sessions]
    turns = []
    for s, t in schedule(sessions, order):
        messages = [*histories[s], {"role": "user", "content": sessions[s].turns[t]}]
        start, cpu_start = time.perf_counter(), time.process_time()
        first, pieces = None, []
        gen = ask(messages, sessions[s].max_tokens[t])
        while True:
            try:
                piece = next(gen)
            except StopIteration as stop:
                info = stop.value
                break
            if piece and first is None:
                first = time.perf_counter()
            pieces.append(piece)
        end = time.perf_counter()
        text = "".join(pieces)
        histories[s] = [*messages, {"role": "assistant", "content": text}]
        turns.append({"session": sessions[s].name, "turn": t + 1, "text": text, "ttft_s": (first or end) - start,
                      "wall_s": end - start, "cpu_s": time.process_time() - cpu_start, **info})
    return turns


def run_edgerun(job: dict[str, Any]) -> dict[str, Any]:
    from runtime.llm.model import LLM
    from runtime.metrics import peak_rss_bytes

    sessions = [Session(**s) for s in job["sessions"]]
    options = {} if job.get("speculate", True) else {"speculate": False}
    with LLM.load(job["model"], ctx=job["n_ctx"], threads=job["threads"], **options) as llm:
        def ask(messages: list[dict[str, str]], max_tokens: int):
            params = llm.params(temperature=0.0, repeat_penalty=1.0, max_tokens=max_tokens, seed=0)
            gen = llm.chat(messages, params)
            yield from gen
            r = gen.result
            spec = {k: v for k, v in r.to_dict().items() if "spec" in k or "draft" in k}
            return {"tokens": r.tokens_out, "stop": r.stop_reason, "prompt_tokens": r.tokens_in, "reused_tokens": r.reused_tokens,
                    "reuse_source": r.reuse_source, **spec}

        turns = _replay(sessions, job["order"], ask)
        return {"threads": llm.placement.threads, "n_ctx": llm.n_ctx, "placement": llm.placement.summary(),
                "plan": llm.plan.to_dict(), "turns": turns, "peak_rss_bytes": peak_rss_bytes()}


def run_raw(job: dict[str, Any]) -> dict[str, Any]:
    from llama_cpp import Llama

    from runtime.metrics import peak_rss_bytes

    sessions = [Session(**s) for s in job["sessions"]]
    threads = job["threads"]
    # As the README shows, plus what "same GGUF and threads" needs: the thread count edgerun chose, for prompts
    # too (llama-cpp-python's n_threads_batch default is every CPU); verbose off, as edgerun's log is.
    # The control run ("raw-fa") adds flash_attn=True, edgerun's attention kernel: it tells numerics from mistakes.
    extra = {"flash_attn": True} if job.get("flash_attn") else {}
    llm = Llama(model_path=job["gguf"], n_ctx=job["n_ctx"], n_threads=threads, n_threads_batch=threads, verbose=False, **extra)
    try:
        def ask(messages: list[dict[str, str]], max_tokens: int):
            finish = None
            text = []
            for chunk in llm.create_chat_completion(messages=messages, temperature=0, max_tokens=max_tokens, stream=True):
                choice = chunk["choices"][0]
                piece = choice["delta"].get("content") or ""
                text.append(piece)
                finish = choice.get("finish_reason") or finish
                yield piece
            n = max_tokens if finish == "length" else len(llm.tokenize("".join(text).encode("utf-8"), add_bos=False, special=False))
            return {"tokens": n, "stop": finish}

        turns = _replay(sessions, job["order"], ask)
        return {"threads": threads, "n_ctx": llm.n_ctx(), "turns": turns, "peak_rss_bytes": peak_rss_bytes()}
    finally:
        llm.close()


def spawn(side: str, job: dict[str, Any]) -> dict[str, Any]:
    """One side in a fresh process: its peak RSS is its own."""
    load_before = os.getloadavg()
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", side], input=json.dumps(job),
                          capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        failed = EdgerunError(f"the {side} worker ({job['order']}) failed with exit {done.returncode}: {tail}")
        failed.exit_code = done.returncode if 0 < done.returncode < 128 else 1
        raise failed
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"side": side, "order": job["order"], "load_before": load_before, "load_after": os.getloadavg(), **result}


# -- report -----------------------------------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median effective tokens/s (the lower middle one of an even count)."""
    ranked = sorted(runs, key=lambda run: summarize(run)["effective_tps"])
    return ranked[(len(ranked) - 1) // 2]


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    turns = run["turns"]
    tokens = sum(t["tokens"] for t in turns)
    wall = sum(t["wall_s"] for t in turns)
    ttft = [t["ttft_s"] * 1000 for t in turns]
    return {"turns": len(turns), "tokens": tokens, "wall_s": wall, "effective_tps": tokens / wall if wall else 0.0,
            "cpu_s": sum(t.get("cpu_s", 0.0) for t in turns), "first_token_s": sum(t["ttft_s"] for t in turns),
            "ttft_p50_ms": percentile(ttft, 50), "ttft_p95_ms": percentile(ttft, 95),
            "peak_rss_mib": run["peak_rss_bytes"] / 2**20, "threads": run["threads"]}


def paired(ons: list[dict[str, Any]], offs: list[dict[str, Any]]) -> dict[str, Any]:
    """Speculation on/off from runs taken in turns: the ratio of each repeat's pair (run i of each side, adjacent in
    time, so a slow spell of a shared machine weighs on both), by wall time and by CPU time (the process's, which
    leaves out the time other processes held the cores), and the median of each. Above 1: speculation is faster."""
    walls, cpus = [], []
    for on, off in zip(ons, offs, strict=True):
        a, b = summarize(on), summarize(off)
        walls.append(a["effective_tps"] / b["effective_tps"] if b["effective_tps"] else 0.0)
        # the same work per token on both sides: tokens per CPU second, on over off
        cpus.append((a["tokens"] / a["cpu_s"]) / (b["tokens"] / b["cpu_s"]) if a["cpu_s"] and b["cpu_s"] and b["tokens"] else 0.0)
    return {"wall": walls, "cpu": cpus, "wall_median": statistics.median(walls), "cpu_median": statistics.median(cpus)}


def ceiling(raw: dict[str, Any], target: float = TARGET) -> dict[str, Any]:
    """What ``target`` x raw's effective tokens/s asks of decoding when edgerun's prompts cost what raw's did (as in
    the sequential order, where raw reuses its live cache too): raw's share of wall time before first tokens, and
    the decode speed-up that target then needs (None: out of reach even with decoding free)."""
    share = raw["first_token_s"] / raw["wall_s"] if raw["wall_s"] else 0.0
    room = 1 / target - share
    return {"target": target, "raw_first_token_share": share,
            "decode_speedup_needed": (1 - share) / room if room > 0 else None}


def edgerun_detail(run: dict[str, Any]) -> dict[str, Any]:
    """Where edgerun's time went: prompt tokens reused (and from where), speculation drafted and accepted."""
    turns = run["turns"]
    sources: dict[str, int] = {}
    for t in turns:
        sources[t["reuse_source"]] = sources.get(t["reuse_source"], 0) + 1
    spec = [t.get("speculation") or {} for t in turns]
    return {"prompt_tokens": sum(t["prompt_tokens"] for t in turns), "reused_tokens": sum(t["reused_tokens"] for t in turns),
            "reuse_sources": sources, "drafted": sum(s.get("drafted", 0) for s in spec),
            "accepted": sum(s.get("accepted", 0) for s in spec), "speculation_on_at_end": sum(bool(s.get("on")) for s in spec),
            # speculation's own account (runtime.llm.speculative.SpecStats): seconds its verify steps saved over the plain
            # steps they stood for, and seconds spent drafting
            "saved_s": sum(s.get("saved_ms", 0.0) for s in spec) / 1000, "draft_s": sum(s.get("draft_ms", 0.0) for s in spec) / 1000}


def compare(edgerun: dict[str, Any], raw: dict[str, Any]) -> dict[str, Any]:
    """Greedy text per turn, matched by (session, turn); the first mismatch in replay order is shown."""
    theirs = {(t["session"], t["turn"]): t["text"] for t in raw["turns"]}
    mismatches = [t for t in edgerun["turns"] if theirs.get((t["session"], t["turn"])) != t["text"]]
    out: dict[str, Any] = {"turns": len(edgerun["turns"]), "mismatches": len(mismatches), "first_mismatch": None}
    if mismatches:
        t = mismatches[0]
        other = theirs.get((t["session"], t["turn"]), "")
        at = next((i for i, (a, b) in enumerate(zip(t["text"], other, strict=False)) if a != b), min(len(t["text"]), len(other)))
        out["first_mismatch"] = {"session": t["session"], "turn": t["turn"], "at_char": at,
                                 "edgerun": t["text"][max(0, at - 40) : at + 80], "raw": other[max(0, at - 40) : at + 80]}
    return out


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("llama-cpp-python", "edgerun", "numpy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, cwd=ROOT)
    out["commit"] = git.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "") if git.returncode == 0 else "unknown"
    return out


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"cpus": os.cpu_count(), "arch": platform.machine()}
    try:
        cpu = Path("/proc/cpuinfo").read_text()
        info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in cpu.splitlines() if ln.startswith("model name")), "")
        mem = Path("/proc/meminfo").read_text().split("\n", 1)[0].split()
        info["mem_gib"] = round(int(mem[1]) / 2**20, 1)
    except OSError:
        pass
    return info


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "load average: {:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg())


def print_table(report: dict[str, Any]) -> None:
    m = report["model"]
    print(f"workload: {len(report['sessions'])} sessions, {report['turns_per_order']} turns per order; {m['ref']}; "
          f"n_ctx {report['n_ctx']}; {report['uptime_before']}")
    print(f"{'order':<12}{'side':<14}{'threads':>8}{'tokens':>8}{'wall s':>9}{'eff tok/s':>11}{'TTFT p50 ms':>13}"
          f"{'TTFT p95 ms':>13}{'peak RSS MiB':>14}{'load':>6}")
    for order, o in report["orders"].items():
        for side in (*SIDES, *([PLAIN] if PLAIN in o else [])):
            s, run = o[side], o["runs"][side]
            print(f"{order:<12}{side:<14}{s['threads']:>8}{s['tokens']:>8}{s['wall_s']:>9.1f}{s['effective_tps']:>11.1f}"
                  f"{s['ttft_p50_ms']:>13.1f}{s['ttft_p95_ms']:>13.1f}{s['peak_rss_mib']:>14.1f}{run['load_before'][0]:>6.2f}")
        same = o["greedy"]
        line = (f"{'':<12}edgerun/raw effective tokens/s {o['ratio']:.2f}x; greedy text identical in "
                f"{same['turns'] - same['mismatches']}/{same['turns']} turns")
        print(line)
        _print_mismatch(same["first_mismatch"], "raw")
        c = o.get("ceiling")
        if c:
            need = c["decode_speedup_needed"]
            print(f"{'':<12}raw spent {100 * c['raw_first_token_share']:.0f}% of its wall before first tokens: with prompts "
                  f"as costly, {c['target']:g}x needs decoding " + (f"{need:.2f}x faster" if need else "faster than free"))
        if report.get("repeats", 1) > 1:
            print(f"{'':<12}effective tok/s of every run (median shown above): "
                  + "; ".join(f"{side} " + " ".join(f"{x:.1f}" for x in xs) for side, xs in o["repeats"].items()))
        if PLAIN in o:
            plain = o["greedy_vs_plain"]
            print(f"{'':<12}speculation on/off (edgerun / {PLAIN}) effective tokens/s {o['speculation_ratio']:.3f}x; greedy "
                  f"text identical in {plain['turns'] - plain['mismatches']}/{plain['turns']} turns")
            pair = o.get("speculation_paired")
            if pair and len(pair["wall"]) > 1:
                print(f"{'':<12}on/off per repeat pair, by wall time " + " ".join(f"{x:.3f}" for x in pair["wall"])
                      + f" (median {pair['wall_median']:.3f}); by CPU time " + " ".join(f"{x:.3f}" for x in pair["cpu"])
                      + f" (median {pair['cpu_median']:.3f})")
        d = o["edgerun_detail"]
        print(f"{'':<12}edgerun reused {d['reused_tokens']}/{d['prompt_tokens']} prompt tokens (turns by source: "
              + ", ".join(f"{k} {v}" for k, v in sorted(d["reuse_sources"].items()))
              + f"); speculation accepted {d['accepted']}/{d['drafted']} drafted tokens, on at the end of "
              f"{d['speculation_on_at_end']}/{same['turns']} turns")
        wall = o["edgerun"]["wall_s"]
        if "saved_s" in d and wall:
            net = (d["saved_s"] - d["draft_s"]) / wall
            print(f"{'':<12}speculation's own account: verify steps saved {d['saved_s']:.2f} s, drafting took {d['draft_s']:.2f} s: "
                  f"net {100 * net:+.1f}% of edgerun's {wall:.1f} s")
        if "greedy_vs_control" in o:
            ctl = o["greedy_vs_control"]
            print(f"{'':<12}control (raw with flash_attn=True, edgerun's attention kernel; {o[CONTROL]['effective_tps']:.1f} tok/s): "
                  f"greedy text identical in {ctl['turns'] - ctl['mismatches']}/{ctl['turns']} turns")
            _print_mismatch(ctl["first_mismatch"], CONTROL)


def _print_mismatch(first: dict[str, Any] | None, other: str) -> None:
    if first:
        print(f"{'':<12}first mismatch: {first['session']} turn {first['turn']} at char {first['at_char']}: "
              f"edgerun {first['edgerun']!r} / {other} {first['raw']!r}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="default", help="bundle, installed name or 'default' (default: default)")
    ap.add_argument("--ctx", type=int, default=4096, help="context size for both sides (default 4096)")
    ap.add_argument("--threads", type=int, help="threads for both sides (default: edgerun's choice, given to raw too)")
    ap.add_argument("--orders", nargs="+", choices=ORDERS, default=list(ORDERS))
    ap.add_argument("--sessions", nargs="+", metavar="NAME", help="replay only these sessions (default: all)")
    ap.add_argument("--turns", type=int, help="replay only each session's first N turns (a smoke run)")
    ap.add_argument("--max-tokens", type=int, help="cap every turn's max_tokens (a smoke run)")
    ap.add_argument("--no-control", dest="control", action="store_false",
                    help="skip the control run (raw with flash_attn=True, only to check the greedy text against)")
    ap.add_argument("--no-speculate", dest="speculate", action="store_false",
                    help="edgerun without speculative decoding (an ablation: what the prefix cache alone gives)")
    ap.add_argument("--ablate", action="store_true",
                    help=f"add a side {PLAIN!r}, edgerun with speculation off, to measure speculation in the same run")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each side, taking turns; the median is reported (default 1)")
    ap.add_argument("--workload", type=Path, default=WORKLOAD_DIR, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "workload.json")
    ap.add_argument("--worker", choices=(*SIDES, PLAIN), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        job = json.loads(sys.stdin.read())
        try:
            print(json.dumps((run_raw if args.worker == "raw" else run_edgerun)(job)))
        except EdgerunError as exc:
            print(f"{exc}", file=sys.stderr)
            return exc.exit_code
        return 0
    try:
        return _bench(args)
    except EdgerunError as exc:
        print(f"workload: {exc}", file=sys.stderr)
        return exc.exit_code


def _bench(args: argparse.Namespace) -> int:
    from runtime.bundle.resolve import resolve

    sessions = load_sessions(args.workload, args.sessions)
    for flag, value in (("--turns", args.turns), ("--max-tokens", args.max_tokens), ("--ctx", args.ctx), ("--threads", args.threads),
                        ("--repeats", args.repeats)):
        if value is not None and value < 1:
            raise BadInput(f"{flag} must be a positive integer, got {value}")
    if args.turns or args.max_tokens:
        cap = args.max_tokens or MAX_TURN_TOKENS
        n = args.turns or max(len(s.turns) for s in sessions)
        sessions = [Session(s.name, s.kind, s.system, s.turns[:n], tuple(min(m, cap) for m in s.max_tokens[:n]), s.sources)
                    for s in sessions]
    model = resolve(args.model)
    load = os.getloadavg()
    if load[0] > 0.5 * (os.cpu_count() or 1):
        print(f"workload: the machine is not quiet (load {load[0]:.2f} on {os.cpu_count()} CPUs): figures are preliminary",
              file=sys.stderr)
    report: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(), "uptime_before": uptime(), "versions": versions(),
        "model": {"ref": model.manifest.ref, "gguf": str(model.path())},
        "n_ctx": args.ctx,
        "speculation_option": _speculation_option() and args.speculate,
        "sessions": [{"name": s.name, "kind": s.kind, "turns": len(s.turns), "max_tokens": list(s.max_tokens),
                      "sources": list(s.sources)} for s in sessions],
        "turns_per_order": sum(len(s.turns) for s in sessions),
        "repeats": args.repeats,
        "orders": {},
    }
    where = model.path() if Path(args.model).suffix == ".gguf" else model.directory  # a bare GGUF: the file itself
    for order in args.orders:
        job = {"model": str(where), "gguf": str(model.path()), "n_ctx": args.ctx, "threads": args.threads,
               "order": order, "sessions": [asdict(s) for s in sessions], "speculate": args.speculate}
        sides = [*SIDES, *([PLAIN] if args.ablate else [])]
        every: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
        for _ in range(args.repeats):
            for side in sides:
                every[side].append(spawn(side, {**job, "speculate": False} if side == PLAIN else job))
                if job["threads"] is None:
                    job["threads"] = every[side][-1]["threads"]  # the threads edgerun chose, for every later run
        runs = {side: median_run(every[side]) for side in sides}
        e, r = summarize(runs["edgerun"]), summarize(runs["raw"])
        result = {"edgerun": e, "raw": r, "ratio": e["effective_tps"] / r["effective_tps"] if r["effective_tps"] else 0.0,
                  "greedy": compare(runs["edgerun"], runs["raw"]), "edgerun_detail": edgerun_detail(runs["edgerun"]),
                  "runs": runs, "repeats": {side: [summarize(run)["effective_tps"] for run in every[side]] for side in sides}}
        result["ceiling"] = ceiling(r)
        if args.ablate:
            p = result[PLAIN] = summarize(runs[PLAIN])
            result["speculation_ratio"] = e["effective_tps"] / p["effective_tps"] if p["effective_tps"] else 0.0
            result["speculation_paired"] = paired(every["edgerun"], every[PLAIN])
            result["greedy_vs_plain"] = compare(runs["edgerun"], runs[PLAIN])
        if args.control:
            runs[CONTROL] = spawn("raw", {**job, "flash_attn": True})
            result[CONTROL] = summarize(runs[CONTROL])
            result["greedy_vs_control"] = compare(runs["edgerun"], runs[CONTROL])
        report["orders"][order] = result
    report["uptime_after"] = uptime()
    print_table(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    print(f"\nwrote {args.out}")
    return 0


def _speculation_option() -> bool:
    import inspect

    from runtime.llm.model import LLM

    return "speculate" in inspect.signature(LLM.load).parameters


if __name__ == "__main__":
    sys.exit(main())
