"""The residency manager's kinds: one loader class per ResidentKind in one table, typed against ModelSpec, and no
kind chosen by comparing strings anywhere in runtime/residency (the style guide's "a backend chosen by a string
compared in many places", for model kinds). Read from the source with ``ast`` where the rule is about the code."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import sys
from pathlib import Path

import pytest

from runtime.bundle.manifest import ModelKind
from runtime.errors import BadInput
from runtime.residency.loaders import LOADERS, LoadOptions, PlannedLoader, default_loaders
from runtime.residency.manager import ModelSpec, ResidencyManager, ResidentKind

ROOT = Path(__file__).resolve().parents[2]
RESIDENCY = ROOT / "runtime" / "residency"
KIND_STRINGS = {k.value for k in ResidentKind} | {k.value for k in ModelKind}


def _strings(node: ast.AST) -> list[str]:
    """The string constants ``node`` is, or holds as a tuple, list or set display."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for elt in node.elts for s in _strings(elt)]
    return []


def kind_comparisons(source: str) -> list[str]:
    """``line: text`` of every comparison (==, !=, in, is, a match case) against a kind's string in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.MatchValue):
            operands = [node.value]
        else:
            continue
        if any(s in KIND_STRINGS for op in operands for s in _strings(op)):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize(("source", "hits"), [
    ('if spec.kind == "llm":\n    pass\n', 1),  # the shape the loaders used to dispatch on
    ('x = self.kind != "asr"\n', 1),
    ('x = kind in ("vad", "tts")\n', 1),  # a tuple of kinds is still a string choice
    ('match kind:\n    case "vision":\n        pass\n', 1),
    ('x = spec.kind is ResidentKind.LLM\n', 0),  # the enum is how a kind is named
    ('x = name == "chat"\n', 0),  # other strings are not kinds
    ('raise BadInput("not kind \'llm\'")\n', 0),  # a message that names a kind compares nothing
])
def test_the_checker_sees_kind_string_comparisons(source: str, hits: int) -> None:
    assert len(kind_comparisons(source)) == hits


def test_no_kind_string_is_compared_in_runtime_residency() -> None:
    files = sorted(RESIDENCY.glob("*.py"))
    assert RESIDENCY / "loaders.py" in files
    found = [f"{path.relative_to(ROOT)}:{hit}" for path in files for hit in kind_comparisons(path.read_text())]
    assert not found, "kind chosen by a string; use ResidentKind and the LOADERS table:\n" + "\n".join(found)


def test_the_loaders_module_names_no_any() -> None:
    tree = ast.parse((RESIDENCY / "loaders.py").read_text())
    uses = [n.lineno for n in ast.walk(tree) if (isinstance(n, ast.Name) and n.id == "Any")
            or (isinstance(n, ast.Attribute) and n.attr == "Any") or (isinstance(n, ast.alias) and n.name == "Any")]
    assert not uses, f"runtime/residency/loaders.py uses Any on lines {uses}: name the real type or a Protocol"


def _annotation(cls: type, method: str, parameter: str) -> object:
    hint = inspect.signature(getattr(cls, method)).parameters[parameter].annotation
    defined = next(c for c in cls.__mro__ if method in vars(c))
    return eval(hint, vars(sys.modules[defined.__module__])) if isinstance(hint, str) else hint


def test_the_table_has_one_loader_per_kind_typed_against_model_spec() -> None:
    assert set(LOADERS) == set(ResidentKind), "every ResidentKind needs its loader in LOADERS, and only those"
    option_names = {f.name for f in dataclasses.fields(LoadOptions)}
    for kind, cls in LOADERS.items():
        assert cls.KIND is kind, f"{cls.__name__} is registered under {kind} but serves {cls.KIND}"
        assert issubclass(cls, PlannedLoader), f"{cls.__name__} does not use the one plan cache"
        for method in ("plan_bytes", "shared_bytes", "load"):
            assert _annotation(cls, method, "spec") is ModelSpec, f"{cls.__name__}.{method} is not typed against ModelSpec"
        assert set(cls.OPTIONS) <= option_names, f"{cls.__name__}'s options {cls.OPTIONS} are not all LoadOptions fields"
    assert {kind: type(loader) for kind, loader in default_loaders().items()} == dict(LOADERS)


def test_the_manager_accepts_exactly_the_table_s_kinds() -> None:
    with pytest.raises(BadInput, match="kind 'nope' is not one of: " + ", ".join(sorted(k.value for k in ResidentKind)) + "$"):
        ResidencyManager(1 << 30).add(ModelSpec("m", "x", "nope"))


@pytest.mark.parametrize("kind", list(ResidentKind))
def test_a_kind_given_as_a_string_or_as_the_enum_is_the_same_spec(kind: ResidentKind) -> None:
    # ModelSpec.kind stays a string in the API: callers and config files write "llm".
    loaders = default_loaders()
    assert loaders[kind.value] is loaders[kind]
    assert ModelSpec("m", "x", kind.value) == ModelSpec("m", "x", kind)
