"""``edgerun bench LLM``: prefill (pp) and decode (tg) tokens/s per thread count, as llama-bench reports them.

pp N: N prompt tokens decoded by one backend call into an empty context (the backend splits them into its batches).
tg N: N tokens decoded one call each, from an empty context. Each is the mean and standard deviation over
``runs`` timed runs after one untimed warm-up, as llama-bench's ``-r`` does; the tokens are a fixed text's, so
every run sees the same work. A length of 0 skips that test, as llama-bench's ``-p 0`` / ``-n 0`` do.

Speculation: greedy generation through :meth:`LLM.generate` on a repetitive prompt (a list, then copies of it:
what prompt-lookup drafting is for), with speculation off and on (the adaptive controller, which switches it
off where it measures no gain), decode tokens/s of each and their ratio, what was drafted and accepted, whether
the greedy text stayed the same; and "forced": drafting never switched off, what the controller chose against.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Any

from runtime.errors import BadInput
from runtime.llm.plan import CTX_PAD, MIN_CTX

# A plain text with no repeats for pp/tg (its tokens repeat only past ~200 tokens, and pp/tg sample nothing).
_FILLER = ("The lighthouse keeper wrote down the wind, the swell, the ships that passed and the hour the lamp was lit. "
           "Small machines at the edge of a network do their work with what they carry: a sensor in a field, a camera "
           "on a loading dock, a kitchen speaker that answers questions without a cloud. ")
# Repetitive: a list and two exact copies; greedy decoding goes on copying it.
_ITEMS = ["flour 500 g", "milk 300 ml", "eggs 2", "butter 40 g", "sugar 1 tablespoon", "salt 1 pinch", "baking powder 2 teaspoons",
          "lemon 1", "apples 3", "cinnamon 1 teaspoon", "honey 2 tablespoons", "yogurt 150 g"]
_LIST = "".join(f"{i + 1}. {item}\n" for i, item in enumerate(_ITEMS))
SPEC_PROMPT = f"Shopping list:\n{_LIST}\nThe same list again:\n{_LIST}\nAnd once more:\n{_LIST}\nAnd once more:\n"


def tokens_of(llm: Any, text: str, n: int) -> list[int]:
    """``n`` tokens of ``text`` repeated (BOS first where the model adds one)."""
    body = llm.backend.tokenize(text, add_bos=False, special=False)
    out = llm.tokenize(text)[: -len(body)]  # the BOS the model adds, if any
    while len(out) < n:
        out.extend(body)
    return out[:n]


def timed_runs(fn: Any, runs: int) -> list[float]:
    fn()  # warm-up: first-touch of the weights' pages and the compute buffers
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def _row(threads: int, test: str, n: int, times: list[float]) -> dict[str, Any]:
    rates = [n / t for t in times]
    return {"threads": threads, "test": test, "tokens": n, "tokens_per_s": statistics.fmean(rates),
            "stddev": statistics.stdev(rates) if len(rates) > 1 else 0.0, "samples": rates}


def pp_tg(llm: Any, threads: int, prompt_tokens: int, gen_tokens: int, runs: int) -> list[dict[str, Any]]:
    """llama-bench's pp and tg rows on a loaded model (its KV is cleared before each run)."""
    backend = llm.backend
    rows = []
    if prompt_tokens:
        prompt = tokens_of(llm, _FILLER, prompt_tokens)

        def prefill() -> None:
            backend.clear()
            backend.decode(prompt, 0)

        rows.append(_row(threads, f"pp{prompt_tokens}", prompt_tokens, timed_runs(prefill, runs)))
    if gen_tokens:
        one = tokens_of(llm, _FILLER, gen_tokens)

        def generate() -> None:
            backend.clear()
            for pos, token in enumerate(one):
                backend.decode([token], pos)

        rows.append(_row(threads, f"tg{gen_tokens}", gen_tokens, timed_runs(generate, runs)))
    backend.clear()
    llm.kv.clear()
    return rows


def _always_on() -> Any:
    from runtime.llm.speculative import Adaptive

    class AlwaysOn(Adaptive):
        """The adaptive controller that never switches speculation off: what drafting gives where it is forced."""

        OFF_BELOW = -1.0

    return AlwaysOn()


def speculation(ref: Any, threads: int, gen_tokens: int, runs: int, common: dict[str, Any], draft: Any = None) -> dict[str, Any]:
    """Decode tokens/s on :data:`SPEC_PROMPT`, greedy, with speculation off and on (a fresh load each; on: prompt
    lookup, or the ``draft`` model). The adaptive controller keeps its state across the runs of one load, as it
    does in a long-running process: the warm-up run lets it settle."""
    from runtime.llm.model import LLM
    from runtime.llm.speculative import Speculator

    out: dict[str, Any] = {"threads": threads, "test": f"tg{gen_tokens} repetitive"}
    texts = {}
    for name, on in (("off", False), ("on", True), ("forced", True)):
        extra = {"draft": draft} if on and draft else {}
        with LLM.load(ref, threads=threads, speculate=on, prefix_cache_bytes=0, **common, **extra) as llm:
            if name == "forced" and llm.speculator is not None:  # the same drafter, never switched off
                llm.speculator = Speculator(llm.speculator.drafter, _always_on())
            params = llm.params(temperature=0.0, repeat_penalty=1.0, max_tokens=gen_tokens, seed=0)
            llm.generate(SPEC_PROMPT, params)  # warm-up
            results = [llm.generate(SPEC_PROMPT, params) for _ in range(runs)]
        rates = [r.decode_tps for r in results]
        texts[name] = results[-1].text
        out[name] = {"decode_tps": statistics.fmean(rates), "stddev": statistics.stdev(rates) if len(rates) > 1 else 0.0,
                     "tokens_out": results[-1].tokens_out, "samples": rates}
        if name == "forced":
            out[name]["stats"] = results[-1].speculation
        elif on:
            out["stats"] = results[-1].speculation  # drafter, enabled, on, steps, drafted, accepted, acceptance, ...
            out["drafter"] = out["stats"].get("drafter") or "none"
    out["text_identical"] = texts["off"] == texts["on"] == texts["forced"]  # greedy: speculation must not change a token
    out["speed_up"] = out["on"]["decode_tps"] / out["off"]["decode_tps"] if out["off"]["decode_tps"] else None
    return out


def context_for(prompt_tokens: int, gen_tokens: int, spec_tokens: int) -> int:
    need = max(prompt_tokens + gen_tokens, spec_tokens + gen_tokens, MIN_CTX)
    return -(-need // CTX_PAD) * CTX_PAD


def measure(ref: Any, threads_list: list[int], prompt_tokens: int, gen_tokens: int, runs: int, *, memory: Any = None,
            target: str = "auto", require_accelerator: bool = False, draft: Any = None) -> dict[str, Any]:
    from runtime.llm.model import LLM

    if not prompt_tokens and not gen_tokens:
        raise BadInput("--prompt-tokens and --gen-tokens are both 0: nothing to measure (give either a positive count)")
    if draft is not None and not gen_tokens:
        raise BadInput("--draft with --gen-tokens 0: the draft model speeds up decoding, give --gen-tokens N")
    load1 = os.getloadavg()[0]
    common = {"memory": memory, "target": target, "require_accelerator": require_accelerator}
    rows: list[dict[str, Any]] = []
    report: dict[str, Any] = {"kind": "llm", "prompt_tokens": prompt_tokens, "gen_tokens": gen_tokens, "runs": runs,
                              "load_at_start": load1}
    spec_len = 0
    for threads in threads_list:
        with LLM.load(ref, threads=threads, prefix_cache_bytes=0, **common,
                      ctx=context_for(prompt_tokens, gen_tokens, 0)) as llm:
            report.setdefault("model", llm.model.manifest.ref)
            report.setdefault("plan", llm.plan.to_dict())
            report.setdefault("placements", []).append(llm.placement.to_dict())
            report.setdefault("summary", llm.placement.summary())
            rows.extend(pp_tg(llm, threads, prompt_tokens, gen_tokens, runs))
            spec_len = len(llm.tokenize(SPEC_PROMPT))
    report["results"] = rows
    if not gen_tokens:
        report["speculation"], report["speculation_absent"] = None, "--gen-tokens 0: no decode to speed up"
    else:
        spec_common = {**common, "ctx": context_for(0, gen_tokens, spec_len)}
        report["speculation"] = [speculation(ref, t, gen_tokens, runs, spec_common, draft) for t in threads_list]
    report["load_at_end"] = os.getloadavg()[0]
    return report


def print_report(report: dict[str, Any]) -> None:
    print(f"edgerun: {report['summary']}", file=sys.stderr)
    print(f"{report['model']}   (load {report['load_at_start']:.2f} at start, {report['load_at_end']:.2f} at end)")
    print(f"  {'threads':>7} {'test':>16} {'t/s':>18}")
    for r in report["results"]:
        print(f"  {r['threads']:>7} {r['test']:>16} {r['tokens_per_s']:>10.2f} ± {r['stddev']:<6.2f}")
    if report["speculation"] is None:
        print(f"  speculation: not measured ({report['speculation_absent']})")
        return
    for s in report["speculation"]:
        line = (f"  {s['threads']:>7} {s['test']:>16}   off {s['off']['decode_tps']:.2f} ± {s['off']['stddev']:.2f}, "
                f"on {s['on']['decode_tps']:.2f} ± {s['on']['stddev']:.2f} t/s")
        if s["speed_up"] is not None:
            line += f", speed-up {s['speed_up']:.2f}x"
        line += f"; forced on {s['forced']['decode_tps']:.2f} t/s"
        stats = s["stats"]
        if not stats.get("enabled"):
            line += " (speculation not available: the backend cannot verify drafts)"
        else:
            line += (f" ({s['drafter']}: {stats.get('accepted', 0)}/{stats.get('drafted', 0)} drafted tokens accepted, "
                     f"speculation {'on' if stats.get('on') else 'off'} at the end)")
        if not s["text_identical"]:
            line += "; GREEDY TEXT DIFFERS with speculation"
        print(line)
