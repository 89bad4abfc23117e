"""One implementation of each shared helper: the copies that used to drift apart stay gone."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from runtime.bundle.manifest import NAME_RE, check_name, name_from

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("runtime", "converters", "apps", "devices")


def _sources() -> dict[Path, str]:
    return {p: p.read_text() for d in PACKAGES for p in sorted((ROOT / d).rglob("*.py"))}


def _assigned(tree: ast.AST, name: str) -> bool:
    return any(isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
               for node in ast.walk(tree))


def test_reserve_fraction_is_defined_once() -> None:
    where = [p.relative_to(ROOT).as_posix() for p, src in _sources().items() if _assigned(ast.parse(src), "RESERVE_FRACTION")]
    assert where == ["runtime/llm/plan.py"]


def test_optional_imports_go_through_runtime_optional_require() -> None:
    copies = [p.relative_to(ROOT).as_posix() for p, src in _sources().items() if re.search(r"def _need\(", src)]
    assert copies == []


def test_names_are_sanitised_in_one_place() -> None:
    # The pattern that turns a file name into a model name appears once: in runtime.bundle.manifest.name_from.
    pattern = 're.sub(r"[^a-z0-9._-]+"'
    where = [p.relative_to(ROOT).as_posix() for p, src in _sources().items() if pattern in src]
    assert where == ["runtime/bundle/manifest.py"]


def test_each_manifest_section_is_defined_once_beside_the_envelope() -> None:
    # runtime/bundle/manifest.py holds the envelope (manifest, files, layout); each model kind's section, the tensor
    # type the classifier kinds share and the typed field readers all of them use are defined once, in their own module.
    homes = {"LLMSpec": "runtime/bundle/specs/llm.py", "VisionSpec": "runtime/bundle/specs/vision.py",
             "Layout": "runtime/bundle/specs/vision.py",
             "AudioSpec": "runtime/bundle/specs/audio.py", "TensorQuant": "runtime/bundle/specs/tensor.py",
             "required_field": "runtime/bundle/fields.py", "floats_field": "runtime/bundle/fields.py",
             "is_finite": "runtime/bundle/fields.py"}
    found: dict[str, list[str]] = {}
    for p, src in _sources().items():
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name in homes:
                found.setdefault(node.name, []).append(p.relative_to(ROOT).as_posix())
    assert found == {name: [home] for name, home in homes.items()}


@pytest.mark.parametrize("text, name", [
    ("SmolLM2-135M-Instruct", "smollm2-135m-instruct"),
    ("My Model (v2)!", "my-model-v2"),
    ("..hidden__", "hidden"),
    ("x" * 63 + " y", "x" * 63 + "-"),
    ("日本語", "model"),
    ("", "model"),
    ("a" * 80, "a" * 64),
])
def test_name_from_always_gives_a_valid_name(text: str, name: str) -> None:
    assert name_from(text) == name
    assert check_name(name_from(text)) == name and NAME_RE.fullmatch(name)


def _functions_using(*names: str) -> list[str]:
    """``path:function`` of every function (methods too) whose body names all of ``names`` (called or read)."""
    found = []
    for p, src in _sources().items():
        for node in ast.walk(ast.parse(src)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            used |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
            if all(name in used for name in names):
                found.append(f"{p.relative_to(ROOT).as_posix()}:{node.name}")
    return found


def test_language_models_load_through_one_path() -> None:
    # Reading a GGUF and resolving where it runs, in one function, is the LLM load path (check, plan, place, open,
    # measure the offload): runtime.llm.loader.open_llm, which LLM.load and Engine.load (with slots and the batched
    # backend) both call. Planning alone (the residency manager's plan_bytes) reads the GGUF but places nothing.
    assert _functions_using("read_gguf", "resolve_placement") == ["runtime/llm/loader.py:open_llm"]
    assert _functions_using("open_llm") == ["runtime/llm/model.py:load", "runtime/serving/engine.py:load"]


def test_llamacpp_offload_is_measured_in_one_place() -> None:
    # The layer count and the per-device tally from llama.cpp's log: one function, which both llama.cpp backends
    # (single sequence and batched) call from their offload().
    assert _functions_using("llama_model_n_layer") == ["runtime/backends/llamacpp.py:layer_offload"]
    offloads = [where for where in _functions_using("layer_offload") if where.endswith(":offload")]
    assert offloads == ["runtime/backends/llamacpp.py:offload", "runtime/backends/llamacpp_batch.py:offload"]


def test_the_answers_room_in_a_context_is_one_rule() -> None:
    # The cells kept free for the answer when a prompt is fitted (LLM, chat, engine slots, the server's refusals).
    rule = re.compile(r"max\(1, min\([^)]*max_tokens[^)]*// 4\)\)")
    where = [p.relative_to(ROOT).as_posix() for p, src in _sources().items() if rule.search(src)]
    assert where == ["runtime/llm/decoding.py"]
