"""``edgerun convert audio``: openWakeWord's "alexa" head with its front end, calibrated on synthesized speech,
through both routes; the bundles detect the wake word in held-out clips; every refusal leaves nothing behind."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from apps.cli import main as edgerun
from converters.vision.gate import compare
from runtime.bundle.manifest import read_manifest_dir, verify_dir
from tests.converters.audio.speech import OTHER, WAKE, synthesize


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("speech")
    calib = root / "calib"
    synthesize(calib, WAKE[:4] + OTHER[:5], [0.85, 1.0, 1.2])
    held_out = root / "eval"  # labelled by subfolder: the word is said in alexa/, not in other/
    wake = set(synthesize(held_out / "alexa", WAKE[4:], [0.9, 1.1], seed=1))
    paths = sorted(wake) + synthesize(held_out / "other", OTHER[5:], [0.9, 1.1], seed=1)
    return {"calib": calib, "eval": held_out, "paths": paths, "wake": wake}


def _convert(speech: dict[str, object], out: Path, fmt: str, quant: str, *extra: str) -> list[str]:
    return ["convert", "audio", "zoo:openwakeword-alexa", "--calib", str(speech["calib"]), "--eval", str(speech["eval"]),
            "--format", fmt, "--quant", quant, "--out", str(out), *extra]


@pytest.fixture(scope="module")
def bundles(speech: dict[str, object], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("audio-bundles")
    out = {"tflite-int8": root / "alexa-tflite-int8", "onnx-int8": root / "alexa-onnx.edgerun"}
    assert edgerun(_convert(speech, out["tflite-int8"], "tflite", "int8")) == 0
    assert edgerun(_convert(speech, out["onnx-int8"], "onnx", "int8")) == 0  # a transport file: installed on first run
    return out


def test_int8_tflite_bundle_carries_front_end_and_passes_gate(bundles: dict[str, Path]) -> None:
    bundle = bundles["tflite-int8"]
    manifest = read_manifest_dir(bundle)
    verify_dir(bundle, manifest)
    spec = manifest.audio
    assert manifest.kind.value == "audio" and manifest.backend.value == "litert"
    assert spec is not None and spec.sample_rate == 16000 and spec.frontend == "openwakeword" and spec.input_shape == (16, 96)
    assert [f.role for f in manifest.files if f.path in spec.frontend_files] == ["frontend", "frontend"]
    assert spec.input.dtype == "int8" and spec.output.dtype == "int8" and spec.quantization == "int8" and spec.arena_bytes > 0
    report = manifest.reports["accuracy"]
    assert report == json.loads((bundle / "report.json").read_text())
    assert report["passed"] and report["top1_agreement"] >= 0.99 and report["samples"] > 100
    assert report["labelled"] == 10 and report["accuracy_float"] == 1.0 and report["accuracy_quant"] == 1.0  # per clip
    # the default gate judged a detector on its decisions over every window and on the clips' accuracy, and passed
    gate = report["gate"]
    assert gate["criterion"] == "default" and gate["default_passed"] and report["min_agreement"] is None
    assert [c["name"] for c in gate["default_checks"]] == ["decision agreement", "accuracy drop"]
    assert report["latency_ratio"] == report["quant_latency_ms"] / report["float_latency_ms"] and report["cpu"]
    # GPTQ looked at the head's 3 Linear layers; at most 500 windows is under 4 rows per weight for each: nearest, said so
    assert report["rounding"]["method"] == "nearest" and len(report["rounding"]["nearest"]) == 3
    assert report["quant_bytes"] * 3 < report["float_bytes"]
    assert "CC-BY-NC-SA" in manifest.license


@pytest.mark.parametrize("which", ["tflite-int8", "onnx-int8"])
def test_run_detects_the_wake_word_in_held_out_clips(bundles: dict[str, Path], speech: dict[str, object], which: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    paths = speech["paths"]
    capsys.readouterr()
    assert edgerun(["run", str(bundles[which]), "--input", *map(str, paths), "--json"]) == 0  # type: ignore[arg-type]
    out = json.loads(capsys.readouterr().out)
    got = {Path(p["input"]): p for p in out["predictions"]}
    for path in paths:  # type: ignore[attr-defined]
        p = got[path]
        assert p["detected"] == (path in speech["wake"]), (path, p)  # type: ignore[operator]
        assert p["resampled_from"] == 22050 and p["labels"][0]["label"] == "alexa"
        if p["detected"]:
            assert 0.2 < p["at_seconds"] <= p["seconds"] + 0.5  # the word is heard inside the clip, not in the padding


def test_detector_gate_compares_decisions() -> None:
    ref = np.array([[0.9], [0.1], [0.6], [0.4]])
    m = compare(ref, np.array([[0.8], [0.2], [0.4], [0.45]]), None)
    assert m["top1_agreement"] == 0.75 and m["top5_agreement"] == 0.75  # one decision flipped (0.6 -> 0.4)
    assert compare(ref, ref * 0.99, None, threshold=0.595)["top1_agreement"] == 0.75  # 0.6 * 0.99 falls below 0.595


def _npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


def _silence(tmp: Path) -> Path:
    from runtime.classify.audio_frontend import write_wav

    folder = tmp / "silence"
    folder.mkdir()
    for i in range(3):
        write_wav(folder / f"{i}.wav", np.zeros(32000, np.float32), 16000)
    return folder


def _bad_wav_folder(tmp: Path) -> Path:
    folder = tmp / "bad"
    folder.mkdir()
    (folder / "broken.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk")
    return folder


CASES = [
    ("empty-folder", lambda s, t: ["--calib", str((t / "none").mkdir() or t / "none")], "no .wav files"),
    ("corrupt-wav", lambda s, t: ["--calib", str(_bad_wav_folder(t))], "not a PCM WAV file"),
    ("npz-wrong-shape", lambda s, t: ["--calib", str(_npz(t / "c.npz", x=np.zeros((20, 16, 95), np.float32)))], "the model takes (16, 96)"),
    ("bad-agreement", lambda s, t: ["--min-agreement", "1.5"], "between 0 and 1"),
    ("bad-threshold", lambda s, t: ["--threshold", "0"], "--threshold"),
    ("unknown-zoo", lambda s, t: ["--name", "x"], "not known"),
    # calibrated on silence, every activation range collapses: the gate must catch it and write nothing
    ("gate-fails", lambda s, t: ["--calib", str(_silence(t))], "accuracy gate failed"),
]


@pytest.mark.parametrize("case, extra, message", CASES, ids=[c[0] for c in CASES])
def test_refusals_exit_with_their_code_and_leave_nothing(speech: dict[str, object], tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           case: str, extra, message: str) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    args = _convert(speech, out_dir / "bundle", "tflite", "int8")
    args += extra(speech, tmp_path)
    if case == "unknown-zoo":
        args[2] = "zoo:hey-nobody"
    capsys.readouterr()
    assert edgerun(args) == (7 if case == "gate-fails" else 2)  # a failed quality gate exits 7, bad input 2
    err = capsys.readouterr().err
    assert message in err, err
    assert list(out_dir.iterdir()) == []


def test_run_refuses_a_file_that_is_not_wav(bundles: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "photo.wav"
    bad.write_bytes(b"\xff\xd8\xff\xe0 a jpeg")
    capsys.readouterr()
    assert edgerun(["run", str(bundles["tflite-int8"]), "--input", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert any("not a WAV file" in line and str(bad) in line for line in err), err


def test_audio_run_opens_no_connection(bundles: dict[str, Path], speech: dict[str, object]) -> None:
    """WAV in, detection out, in a fresh interpreter with an audit hook on every network call: none happens."""
    import os
    import subprocess
    import sys

    root = Path(__file__).parents[3]
    probe = root / "tests" / "runtime" / "offline_probe.py"
    clip = str(sorted(speech["wake"])[0])  # type: ignore[call-overload]
    out = subprocess.run([sys.executable, str(probe), "--cli", "run", str(bundles["tflite-int8"]), "--input", clip, "--json"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(root)}, timeout=120, check=True)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["chat"] == "0" and json.loads(report["text"])["predictions"][0]["detected"] is True  # it really ran
    assert report["events"] == [] and report["hub_modules"] == []


def test_bench_times_the_head_and_the_front_end(bundles: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert edgerun(["bench", str(bundles["tflite-int8"]), "--threads", "1", "--runs", "5", "--batch", "4", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["results"][0]
    assert row["p50_ms"] > 0 and row["throughput_per_s"] > 0 and row["frontend_ms_per_audio_s"] > 0
    assert row["placement"]["backend"] == "litert"


def test_long_files_go_by_segments_with_the_same_windows(bundles: dict[str, Path], speech: dict[str, object]) -> None:
    """A 70 s recording (three segments) gives the windows of the whole clip at once, and finds every wake word."""
    from runtime.classify.audio_classifier import AudioClassifier
    from runtime.classify.audio_frontend import load_audio

    clips = [load_audio(p, 16000).samples for p in speech["paths"]]  # type: ignore[attr-defined]
    long = np.concatenate([np.concatenate([c, np.zeros(8000, np.float32)]) for c in clips * 4])[: 70 * 16000]
    with AudioClassifier.load(str(bundles["tflite-int8"]), threads=1) as clf:
        from runtime.classify.audio_frontend import Audio

        audio = Audio(long, 16000)
        parts = list(clf.segments(audio))
        assert len(parts) == 3
        ends = np.concatenate([p[1] for p in parts])
        whole = clf.frontend.windows(long, 16000)
        np.testing.assert_allclose(ends, whole.ends, atol=1e-9)  # no window lost or repeated at the seams
        seg_scores = np.concatenate([p[0] for p in parts])[:, 0]
        assert ((seg_scores >= 0.5) == (clf.scores(whole.x)[:, 0] >= 0.5)).mean() > 0.99
        assert clf.classify(audio, "long", 1).detected


def test_mel_in_chunks_equals_mel_at_once() -> None:
    from converters.audio import zoo
    from runtime.classify.audio_frontend import OWW_MEL_CHUNK_FRAMES, OpenWakeWordFrontEnd

    fe = OpenWakeWordFrontEnd(*zoo.frontend_files())
    try:
        pcm = (np.random.default_rng(0).standard_normal(16000 * 25) * 3000).astype(np.float32)
        whole = np.squeeze(fe._mel.run(pcm[None])).reshape(-1, 32)
        assert len(whole) > 2 * OWW_MEL_CHUNK_FRAMES
        np.testing.assert_allclose(fe.mel(pcm), whole, atol=1e-4)
    finally:
        fe.close()


def test_plan_counts_front_end_and_inputs_and_refuses_before_loading(bundles: dict[str, Path], speech: dict[str, object],
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert edgerun(["plan", str(bundles["tflite-int8"]), "--memory", "1G", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["runtime_bytes"] == (26 + 66) << 20  # LiteRT for the head, ONNX Runtime for the front end
    assert plan["arena_bytes"] > 8 << 20 and plan["input_bytes"] > 0  # the front end's activations, one segment
    clip = str(speech["paths"][0])  # type: ignore[index]
    assert edgerun(["run", str(bundles["tflite-int8"]), "--input", clip, "--memory", "60M"]) == 3
    err = capsys.readouterr().err
    assert "does not fit the 60.0 MiB budget" in err


def test_rounding_nearest_is_recorded(speech: dict[str, object], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert edgerun(_convert(speech, tmp_path / "nearest", "tflite", "int8", "--rounding", "nearest", "--json")) == 0
    report = json.loads(capsys.readouterr().out)["report"]
    assert report["rounding"] == {"method": "nearest"}  # GPTQ skipped on request: nothing about it in the report
    assert report["passed"]


def test_without_eval_whole_files_are_held_out() -> None:
    # no --eval: every fifth file is scored by the gate, all of its windows (they overlap: holding out single
    # windows would score audio that calibrated); an .npz has no files, so every fifth window
    from converters.audio.clips import ClipSet, hold_out

    x = np.arange(40, dtype=np.float32).reshape(40, 1)
    cal, ev = hold_out(ClipSet(x, np.repeat(np.arange(10), 4), None))  # 10 files of 4 windows
    assert ev.x[:, 0].tolist() == [16, 17, 18, 19, 36, 37, 38, 39] and len(cal) == 32
    cal, ev = hold_out(ClipSet(x, None, None))
    assert ev.x[:, 0].tolist() == [4, 9, 14, 19, 24, 29, 34, 39] and len(cal) == 32
