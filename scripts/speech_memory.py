"""Measure what each speech model adds to a process (RSS) and how fast it runs: the figures behind the
measured plan constants in runtime/speech/asr.py, runtime/speech/vad.py and runtime/speech/tts.py.

Each model is measured in a fresh process over numpy: RSS after importing its library (the runtime term),
after loading it (weights), and the high-water mark while it works (working memory), plus its real-time
factor. Run: ``python scripts/speech_memory.py [--threads 2] [--json out.json]``.

``--assistant [WAKE_BUNDLE]`` measures the voice assistant's own process instead, term by term against its plan
(apps.voice.plan): the process before any model (interpreter, numpy, edgerun, what planning imports), each
library's import in the order the assistant loads them, each model's load through the residency manager, then
rounds of the work the pipeline gives each model, at the largest input it admits (a 30 s utterance, the longest
piece of text Piper is given, a conversation filling the LLM's answers), until a round adds nothing: what a
model keeps resident after working (allocator caches: ONNX Runtime's arena, glibc's raised mmap threshold) and
its transient peak above that. A model's measured own memory is its load plus both; the process peak is the
resident total plus the largest transient, or what a Whisper decode and a Piper sentence at once reach (barge-in:
the next question is heard while the answer is still spoken), whichever is higher.
Run: ``python scripts/speech_memory.py --assistant BUNDLE --json out.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from devices.backends import BackendName

PHRASES = ("Turn on the kitchen lights please.", "What is the capital of France?", "Set a timer for ten minutes.",
           "The quick brown fox jumps over the lazy dog.", "Please remind me to call my mother tomorrow morning.")
# longer than runtime.speech.tts.MAX_PIECE_CHARS, no comma: its first piece is the longest Piper is given (the working memory planned)
LONG = ("the weather today is mostly sunny with a light breeze from the west and a high of twenty two degrees so it is "
        "a good afternoon for a long walk in the park")


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux >= 4.0)


def _assistant_base() -> None:
    """What the voice assistant's process holds before any model: `edgerun voice` imported and its models planned
    (interpreter, numpy, edgerun's modules, llama.cpp; the LLM's runtime term). The speech terms are over this."""
    import apps.cli.voice_cmd  # noqa: F401
    from apps.voice.plan import VoiceModels, plan_voice

    plan_voice(VoiceModels(), 2 << 30)


def child(kind: str, threads: int, audio: str) -> dict:
    _assistant_base()
    out: dict = {"kind": kind, "threads": threads, "base": _status("VmRSS")}
    if kind == "asr":
        import faster_whisper  # noqa: F401

        out["imported"] = _status("VmRSS")
        from runtime.speech.asr import ASR

        model = ASR.load(threads=threads)
        out["loaded"] = _status("VmRSS")
        clips = list(np.load(audio, allow_pickle=True))
        model.transcribe(clips[0])  # warm-up
        _reset_peak()
        results = [model.transcribe(c) for c in clips]
        out["peak"] = _status("VmHWM")
        out["rtf"] = sum(r.elapsed_s for r in results) / sum(r.seconds for r in results)
        out["rtf_each"] = [round(r.rtf, 3) for r in results]
        out["texts"] = [r.text for r in results]
        out["plan"] = model.plan.to_dict()
    elif kind == "vad":
        import onnxruntime  # noqa: F401

        out["imported"] = _status("VmRSS")
        from runtime.speech.vad import SileroVAD

        model = SileroVAD.load(threads=1)
        out["loaded"] = _status("VmRSS")
        x = np.concatenate(list(np.load(audio, allow_pickle=True)))
        _reset_peak()
        t0 = time.perf_counter()
        model.stream().probabilities(x)
        out["rtf"] = (time.perf_counter() - t0) / (len(x) / 16000)
        out["peak"] = _status("VmHWM")
        out["plan"] = model.plan.to_dict()
    else:
        import onnxruntime  # noqa: F401

        out["imported"] = _status("VmRSS")
        from runtime.speech.tts import load_tts

        model = load_tts(threads=threads, fallback=False)
        out["loaded"] = _status("VmRSS")
        list(model.speak("Hello."))  # warm-up (the phonemizer loads its data)
        _reset_peak()
        chunks = [c for text in (*PHRASES, LONG) for c in model.speak(text)]
        out["peak"] = _status("VmHWM")
        out["rtf"] = sum(c.elapsed_s for c in chunks) / sum(c.seconds for c in chunks)
        out["first_sentence_s"] = [round(c.elapsed_s, 3) for c in chunks]
        out["plan"] = model.plan.to_dict()
    return out


# The library each row of the voice plan imports, as the modules that load it (in that order).
LIBRARY_MODULES = {BackendName.LITERT.value: ("ai_edge_litert.interpreter",), BackendName.ORT.value: ("onnxruntime", "onnx"),
                   "ctranslate2": ("faster_whisper",), BackendName.LLAMACPP.value: ("llama_cpp",)}
ROUNDS = 3  # of work per model; the allocators' caches settle within two
TOGETHER_ROUNDS = 4  # of a Whisper decode and a Piper sentence at once


def _work(name: str, model: object, clips: list[np.ndarray]) -> None:
    """One round of what the pipeline gives ``model`` (apps/voice): the largest inputs it admits."""
    if name == "wake":
        from apps.voice.models import WakeWordDetector
        from apps.voice.types import FRAME_SAMPLES

        detector = WakeWordDetector(model, "wake")
        x = np.concatenate(clips[:-1])
        for at in range(0, len(x) - FRAME_SAMPLES + 1, FRAME_SAMPLES):
            detector.detect(x[at : at + FRAME_SAMPLES])
    elif name == "vad":
        from apps.voice.types import FRAME_SAMPLES
        from runtime.speech.vad import SpeechSegmenter

        seg = SpeechSegmenter(model)
        x = clips[-1]
        for at in range(0, len(x) - FRAME_SAMPLES + 1, FRAME_SAMPLES):
            seg.feed(x[at : at + FRAME_SAMPLES])
    elif name == "asr":
        for clip in (clips[0], clips[-1]):  # a short question, a full 30 s window
            model.transcribe(clip)  # type: ignore[attr-defined]
    elif name == "llm":
        from apps.voice.conversation import Conversation

        conv = Conversation()
        for q in ("Tell me a long story about a dragon and a knight.", PHRASES[1]):
            reply = conv.ask(model, q)  # type: ignore[arg-type]
            conv.remember(q, "".join(reply.pieces()))
    else:
        for text in (*PHRASES, LONG):
            list(model.speak(text))  # type: ignore[attr-defined]


def _ort_started() -> object:
    """An ONNX Runtime session of a one-node model, run once: the library's start (allocator, thread pool, kernel
    registry), which is the "ort" term's, not the first speech model's."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "start",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    session.run(None, {"x": np.ones((1, 4), np.float32)})
    return session


def assistant(wake: str | None, threads: int, audio: str) -> dict:
    """The voice assistant's process, term by term (the module docstring)."""
    import importlib

    import apps.cli.voice_cmd  # noqa: F401  (what `edgerun voice` has imported before planning)
    from apps.voice.plan import VoiceModels, open_residency, plan_voice, voice_loaders
    from runtime.residency.loaders import default_loaders
    from runtime.units import parse_size

    clips = list(np.load(audio, allow_pickle=True))
    out: dict = {"base": _status("VmRSS")}
    loaders = voice_loaders(default_loaders())
    plan = plan_voice(VoiceModels(wake=wake, threads=threads), parse_size("2G"), loaders)
    out["planned"] = _status("VmRSS")  # planning imports the runtime's modules and llama.cpp (reading the GGUF)
    out["plan"] = plan.to_dict()
    libraries: dict[str, int] = {}
    started = []
    for lib in plan.libraries:
        before = _status("VmRSS")
        for module in LIBRARY_MODULES.get(lib, ()):
            importlib.import_module(module)
        if lib == BackendName.ORT.value:
            started.append(_ort_started())
        libraries[lib] = _status("VmRSS") - before
    out["libraries"] = libraries
    import piper  # noqa: F401  (the TTS's own Python side, over ONNX Runtime)

    rows: dict[str, dict] = {}
    manager = open_residency(plan, loaders)
    order = [n for n in ("vad", "asr", "llm", "tts", "wake") if n in {r.spec.name for r in plan.rows}]
    models = {}
    for name in order:  # apps.voice.models.leased_models' order
        _reset_peak()
        before = _status("VmRSS")
        models[name] = manager.acquire(name).__enter__()
        rows[name] = {"load": _status("VmRSS") - before, "load_peak": _status("VmHWM") - before, "kept": 0, "transient": 0}
    for _ in range(ROUNDS):
        for name in ("wake", "vad", "asr", "llm", "tts"):
            if name not in models:
                continue
            _reset_peak()
            before = _status("VmRSS")
            _work(name, models[name], clips)
            row = rows[name]
            row["kept"] += max(0, _status("VmRSS") - before)
            row["transient"] = max(row["transient"], _status("VmHWM") - _status("VmRSS"))
    out["resident"] = _status("VmRSS")
    out["peak"] = out["resident"] + max(r["transient"] for r in rows.values())
    if "asr" in models and "tts" in models:  # barge-in: a decode of the new question while a sentence is synthesized
        import threading

        out["together"] = 0
        for _ in range(TOGETHER_ROUNDS):  # how far the two overlap is up to the threads' timing: the most of a few tries
            _reset_peak()
            before = _status("VmRSS")
            asr = threading.Thread(target=lambda: models["asr"].transcribe(clips[-1]))
            asr.start()
            list(models["tts"].speak(LONG))
            asr.join()
            out["together"] = max(out["together"], _status("VmHWM") - before)
            out["peak"] = max(out["peak"], before + out["together"])
    out["rows"] = rows
    manager.close()
    return out


def _assistant_report(m: dict) -> None:
    mib = lambda b: f"{b / 2**20:7.1f}"  # noqa: E731
    plan = m["plan"]
    print(f"process before any model: {mib(m['base'])} MiB; after planning {mib(m['planned'])} MiB")
    print("library       import  planned")
    for lib, size in m["libraries"].items():
        print(f"{lib:<12} {mib(size)}  {mib(plan['libraries'][lib])}")
    print("model    load  (peak)    kept  transient   own   planned own")
    for r in plan["models"]:
        row = m["rows"][r["name"]]
        own = row["load"] + row["kept"] + row["transient"]
        print(f"{r['name']:<6} {mib(row['load'])} ({mib(row['load_peak'])}) {mib(row['kept'])} {mib(row['transient'])}"
              f" {mib(own)} {mib(r['own_bytes'])}")
    if "together" in m:
        print(f"a Whisper decode and a Piper sentence at once: {mib(m['together'])} MiB over what was resident")
    print(f"process peak {mib(m['peak'])} MiB (resident {mib(m['resident'])} after the rounds) against the "
          f"plan's {mib(plan['total_bytes'])} MiB: plan / peak {plan['total_bytes'] / m['peak']:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--assistant", nargs="?", const="", metavar="WAKE_BUNDLE",
                    help="measure the voice assistant's process against its plan (with this wake-word bundle, if given)")
    ap.add_argument("--child", nargs=2, metavar=("KIND", "AUDIO"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    if args.child:
        kind, audio = args.child
        if kind.startswith("assistant:"):
            print(json.dumps(assistant(kind.split(":", 1)[1] or None, args.threads, audio)))
        else:
            print(json.dumps(child(kind, args.threads, audio)))
        return
    from tests.runtime.speech_clips import silence, spoken

    clips = [np.concatenate([silence(0.3), spoken(p), silence(0.3)]) for p in PHRASES]
    clips.append(np.concatenate([*clips, *clips])[: 30 * 16000])  # a full 30 s window
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        audio = f"{tmp}/clips.npy"
        arr = np.empty(len(clips), object)
        arr[:] = clips
        np.save(audio, arr, allow_pickle=True)
        if args.assistant is not None:
            run = subprocess.run([sys.executable, __file__, "--threads", str(args.threads), "--child",
                                  f"assistant:{args.assistant}", audio], capture_output=True, text=True,
                                 cwd=Path(__file__).resolve().parents[1])
            if run.returncode:
                raise SystemExit(f"assistant: the measuring process failed:\n{run.stderr[-2000:]}")
            measured = json.loads(run.stdout.strip().splitlines()[-1])
            _assistant_report(measured)
            if args.json:
                args.json.write_text(json.dumps(measured, indent=1))
            return
        for kind in ("asr", "vad", "tts"):
            run = subprocess.run([sys.executable, __file__, "--threads", str(args.threads), "--child", kind, audio],
                                 capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
            if run.returncode:
                raise SystemExit(f"{kind}: the measuring process failed:\n{run.stderr[-2000:]}")
            row = json.loads(run.stdout.strip().splitlines()[-1])
            mib = lambda b: round(b / 2**20, 1)  # noqa: E731
            row["runtime_mib"] = mib(row["imported"] - row["base"])
            row["weights_mib"] = mib(row["loaded"] - row["imported"])
            row["working_mib"] = mib(row["peak"] - row["loaded"])
            row["adds_mib"] = mib(row["peak"] - row["base"])
            row["plan_mib"] = mib(row["plan"]["total_bytes"])
            rows.append(row)
            print(f"{kind}: runtime {row['runtime_mib']} MiB, weights {row['weights_mib']} MiB, working "
                  f"{row['working_mib']} MiB, adds {row['adds_mib']} MiB (plan {row['plan_mib']} MiB), RTF {row['rtf']:.3f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
