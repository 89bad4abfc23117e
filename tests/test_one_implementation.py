"""One implementation of each shared helper: the copies that used to drift apart stay gone."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from runtime.bundle import NAME_RE, check_name, name_from

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("runtime", "converters", "apps", "devices")


def _sources() -> dict[Path, str]:
    return {p: p.read_text() for d in PACKAGES for p in sorted((ROOT / d).rglob("*.py"))}


def _assigned(tree: ast.AST, name: str) -> bool:
    return any(isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
               for node in ast.walk(tree))


def test_reserve_fraction_is_defined_once() -> None:
    where = [p.relative_to(ROOT).as_posix() for p, src in _sources().items() if _assigned(ast.parse(src), "RESERVE_FRACTION")]
    assert where == ["runtime/plan.py"]


def test_optional_imports_go_through_runtime_optional_require() -> None:
    copies = [p.relative_to(ROOT).as_posix() for p, src in _sources().items() if re.search(r"def _need\(", src)]
    assert copies == []


def test_names_are_sanitised_in_one_place() -> None:
    # The pattern that turns a file name into a model name appears once: in runtime.bundle.name_from.
    pattern = 're.sub(r"[^a-z0-9._-]+"'
    where = [p.relative_to(ROOT).as_posix() for p, src in _sources().items() if pattern in src]
    assert where == ["runtime/bundle.py"]


def test_each_manifest_section_is_defined_once_beside_the_envelope() -> None:
    # runtime/bundle.py holds the envelope (manifest, files, layout); each model kind's section, the tensor type the
    # classifier kinds share and the typed field readers all of them use are defined once, in their own module.
    homes = {"LLMSpec": "runtime/specs/llm.py", "VisionSpec": "runtime/specs/vision.py", "Layout": "runtime/specs/vision.py",
             "AudioSpec": "runtime/specs/audio.py", "TensorQuant": "runtime/specs/tensor.py",
             "required_field": "runtime/manifest_fields.py", "floats_field": "runtime/manifest_fields.py",
             "is_finite": "runtime/manifest_fields.py"}
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
