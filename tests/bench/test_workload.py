"""bench/workload.py: the committed sessions load and check, the replay orders, the comparison, and a smoke run of
both sides (edgerun and raw llama-cpp-python, each in its own process) on a 1-turn, few-token subset."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench.workload import KINDS, WORKLOAD_DIR, compare, load_sessions, main, percentile, schedule
from runtime.errors import BadInput


def test_the_committed_sessions_load_and_cover_every_kind() -> None:
    sessions = load_sessions()
    assert {s.kind for s in sessions} == set(KINDS)
    assert len({s.system for s in sessions}) == 1 and "offline" in sessions[0].system  # one shared system prompt
    assert len({s.name for s in sessions}) == len(sessions)
    assert any(s.kind == "chat" and len(s.turns) >= 3 for s in sessions)  # chats that refer back
    sources = [src for s in sessions for src in s.sources]
    assert any("package" in src for src in sources) and any("repo" in src for src in sources)
    for src in sources:  # every text names its file or origin and its license
        assert src["license"] and ("repo" in src or "package" in src or src["origin"])
    for s in sessions:
        assert "{text}" not in "".join(s.turns)  # every placeholder filled
        assert all(1 <= m <= 512 for m in s.max_tokens)


def _copy(tmp_path: Path) -> Path:
    d = tmp_path / "workload"
    shutil.copytree(WORKLOAD_DIR, d)
    return d


def _edit(d: Path, name: str, change) -> None:
    path = d / f"{name}.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    "name, change, fragment",
    [
        ("license", lambda d: d["turns"][0]["text"].update(sha256="0" * 64), "no longer the same workload"),
        ("lighthouse", lambda d: d["turns"][0]["text"].update(lines=[1, 9999]), "goes past the file's"),
        ("lighthouse", lambda d: d["turns"][0]["text"].update(repo="../../etc/passwd"), "is not a file in"),
        ("license", lambda d: d["turns"][0]["text"].update(package="no-such-package-xyz"), "is not installed"),
        ("license", lambda d: d["turns"][0]["text"].update(path="nope/LICENSE"), "has no file 'nope/LICENSE'"),
        ("garden", lambda d: d.update(kind="poem"), "'kind' must be one of"),
        ("garden", lambda d: d.update(colour="red"), "unknown keys ['colour']"),
        ("garden", lambda d: d.update(max_tokens=0), "max_tokens (of the turn or the session) must be"),
        ("garden", lambda d: d["turns"][1].update(max_tokens=100000), "turn 2: max_tokens"),
        ("garden", lambda d: d.update(turns=[]), "'turns' must be a non-empty list"),
        ("garden", lambda d: d["turns"][0].update(user="see {text}"), "names no 'text'"),
        ("license", lambda d: d["turns"][0].update(user="no placeholder"), "place it with {text}"),
        ("garden", lambda d: d.update(system={"shared": "../system.txt"}), "is not in"),
        ("garden", lambda d: d.update(name="license"), "repeated: license"),
    ],
    ids=["sha-changed", "lines-past-end", "repo-escape", "no-package", "no-file", "kind", "unknown-key", "max-0",
         "turn-max-huge", "no-turns", "stray-placeholder", "missing-placeholder", "system-outside", "duplicate-name"],
)
def test_a_bad_session_is_refused_in_one_line_naming_it(tmp_path, name, change, fragment) -> None:
    d = _copy(tmp_path)
    _edit(d, name, change)
    with pytest.raises(BadInput) as err:
        load_sessions(d)
    message = str(err.value)
    assert fragment in message and "\n" not in message


def test_invalid_json_and_unknown_names_are_refused(tmp_path) -> None:
    d = _copy(tmp_path)
    with pytest.raises(BadInput, match="no session named nope"):
        load_sessions(d, ["nope"])
    (d / "broken.json").write_text("{")
    with pytest.raises(BadInput, match="broken.json: not valid JSON"):
        load_sessions(d)
    with pytest.raises(BadInput, match="no session files"):
        load_sessions(tmp_path)


def test_orders_sequential_and_interleaved() -> None:
    a, b = load_sessions(names=["garden", "lighthouse"])  # 3 turns and 2 turns
    assert schedule([a, b], "sequential") == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    assert schedule([a, b], "interleaved") == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2)]  # round-robin, users take turns


def test_compare_counts_mismatches_and_shows_the_first() -> None:
    def run(*texts: str) -> dict:
        return {"turns": [{"session": "s", "turn": i + 1, "text": t} for i, t in enumerate(texts)]}

    same = compare(run("a", "b"), run("a", "b"))
    assert same == {"turns": 2, "mismatches": 0, "first_mismatch": None}
    diff = compare(run("a", "the cat sat", "x"), run("a", "the dog sat", "y"))
    assert diff["mismatches"] == 2
    assert diff["first_mismatch"]["turn"] == 2 and diff["first_mismatch"]["at_char"] == 4
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5 and percentile([5.0], 95) == 5.0


@pytest.mark.slow  # three fresh processes, each loading the model: ~8 s quiet, over 20 s on a busy machine
def test_smoke_both_sides_on_one_turn(smollm, tmp_path, capsys) -> None:
    out = tmp_path / "workload.json"
    argv = ["--sessions", "garden", "license", "--turns", "1", "--max-tokens", "6", "--orders", "interleaved", "--threads", "1",
            "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "interleaved" in printed and "edgerun/raw effective tokens/s" in printed
    report = json.loads(out.read_text())
    assert report["machine"]["cpus"] and "load average" in report["uptime_before"] and report["versions"]["llama-cpp-python"]
    o = report["orders"]["interleaved"]
    for side in ("edgerun", "raw", "raw-fa"):
        run = o["runs"][side]
        assert [(t["session"], t["turn"]) for t in run["turns"]] == [("garden", 1), ("license", 1)]
        assert run["threads"] == 1 and run["peak_rss_bytes"] > 50 << 20  # its own process: a model's worth
        for t in run["turns"]:
            assert 1 <= t["tokens"] <= 6 and 0 < t["ttft_s"] <= t["wall_s"] and t["text"]
    assert o["edgerun"]["tokens"] > 0 and o["ratio"] > 0
    d = o["edgerun_detail"]
    assert d["prompt_tokens"] > d["reused_tokens"] > 0 and sum(d["reuse_sources"].values()) == 2  # the 2nd reuses the system prompt
    assert "edgerun reused" in printed
    # The first turn's prompt is prefilled cold on both: the same template, tokens and attention kernel give the
    # same greedy text (a chat-template or tokenization difference would show here).
    assert o["greedy_vs_control"]["mismatches"] == 0, o["greedy_vs_control"]


def test_bad_flags_exit_2_in_one_line(capsys) -> None:
    assert main(["--turns", "0"]) == 2
    err = capsys.readouterr().err
    assert "--turns must be a positive integer" in err and err.count("\n") == 1


def test_a_worker_refusal_is_one_line_with_its_exit_code(smollm, tmp_path, capsys) -> None:
    argv = ["--sessions", "garden", "--turns", "1", "--max-tokens", "2", "--ctx", "100000", "--no-control",
            "--orders", "sequential", "--out", str(tmp_path / "w.json")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "the edgerun worker (sequential) failed with exit 2" in err and "training context" in err and "Traceback" not in err
    assert not (tmp_path / "w.json").exists()  # no half-written report


def test_median_run_is_the_middle_of_the_repeats() -> None:
    from bench.workload import median_run

    def run(tps: float) -> dict:
        return {"turns": [{"tokens": int(tps * 10), "wall_s": 10.0, "ttft_s": 0.1}], "peak_rss_bytes": 1, "threads": 1, "id": tps}

    assert median_run([run(3.0), run(1.0), run(2.0)])["id"] == 2.0
    assert median_run([run(4.0), run(1.0), run(2.0), run(3.0)])["id"] == 2.0  # the lower middle of an even count
    assert median_run([run(5.0)])["id"] == 5.0


@pytest.mark.slow  # four fresh processes, each loading the model
def test_ablate_runs_edgerun_without_speculation_in_the_same_run(smollm, tmp_path, capsys) -> None:
    out = tmp_path / "workload.json"
    argv = ["--sessions", "garden", "--turns", "1", "--max-tokens", "4", "--orders", "sequential", "--threads", "1",
            "--no-control", "--ablate", "--repeats", "2", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "speculation on/off (edgerun / edgerun-plain)" in printed and "effective tok/s of every run" in printed
    o = json.loads(out.read_text())["orders"]["sequential"]
    assert {side: len(xs) for side, xs in o["repeats"].items()} == {"edgerun": 2, "raw": 2, "edgerun-plain": 2}
    assert o["speculation_ratio"] > 0 and o["greedy_vs_plain"]["mismatches"] == 0  # greedy: the same text, on or off
    plain = [t.get("speculation") or {} for t in o["runs"]["edgerun-plain"]["turns"]]
    assert all(not s.get("enabled") for s in plain)  # speculation was off on that side
    assert len(o["speculation_paired"]["wall"]) == len(o["speculation_paired"]["cpu"]) == 2
    assert all(t["cpu_s"] > 0 for t in o["runs"]["edgerun"]["turns"]) and 0 < o["ceiling"]["raw_first_token_share"] < 1
    assert "on/off per repeat pair" in printed and "before first tokens" in printed
    assert o["edgerun_detail"]["draft_s"] > 0 and "speculation's own account" in printed  # shadow drafts while off too


def _run(tokens: int, wall: float, cpu: float, ttft: float = 0.1) -> dict:
    return {"turns": [{"tokens": tokens, "wall_s": wall, "cpu_s": cpu, "ttft_s": ttft}], "peak_rss_bytes": 0, "threads": 1}


def test_ceiling_is_the_decode_speedup_the_target_needs_when_prompts_cost_the_same() -> None:
    from bench.workload import ceiling, summarize

    # raw: 14.2 s of 36.3 s before first tokens (the sequential run of 2026-12-05): 1.5x needs decoding 2.21x faster
    c = ceiling(summarize(_run(2139, 36.3, 36.0, ttft=14.2)))
    assert c["raw_first_token_share"] == pytest.approx(14.2 / 36.3)
    assert c["decode_speedup_needed"] == pytest.approx((1 - 14.2 / 36.3) / (1 / 1.5 - 14.2 / 36.3))
    assert 2.2 < c["decode_speedup_needed"] < 2.22
    # prompts past two thirds of the wall: no decode speed-up reaches 1.5x
    assert ceiling(summarize(_run(100, 10.0, 10.0, ttft=7.0)))["decode_speedup_needed"] is None


def test_speculation_is_paired_per_repeat_by_wall_and_by_cpu_time() -> None:
    from bench.workload import paired

    # repeat 2 ran in a slow spell that slowed both of its sides' wall time, not their CPU time
    ons = [_run(100, 1.0, 1.0), _run(100, 2.0, 1.0), _run(100, 1.0, 1.0)]
    offs = [_run(100, 1.1, 1.1), _run(100, 2.2, 1.1), _run(100, 1.0, 1.0)]
    p = paired(ons, offs)
    assert p["wall"] == pytest.approx([1.1, 1.1, 1.0])
    assert p["cpu"] == pytest.approx([1.1, 1.1, 1.0])
    assert p["wall_median"] == pytest.approx(1.1) and p["cpu_median"] == pytest.approx(1.1)
    # the median of the pairs, not the ratio of medians: one pair's outlier does not move it
    ons[2] = _run(100, 5.0, 1.0)
    assert paired(ons, offs)["wall_median"] == pytest.approx(1.1)
