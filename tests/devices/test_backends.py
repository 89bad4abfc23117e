"""The one backend table (devices/backends.py): every entry points at real code, every model format and kind
has a backend, and no other module spells a backend's name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from devices.backends import BACKENDS, BackendName, for_format, serving, spec
from devices.capabilities import probe
from runtime.bundle.manifest import BACKEND_FORMAT, ModelFormat, ModelKind
from runtime.errors import BadInput

ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("apps", "bench", "converters", "devices", "models", "runtime", "scripts")
TABLE = Path("devices/backends.py")
NAMES = frozenset(b.value for b in BackendName if b is not BackendName.NULL)  # "null" is also JSON's and a format's word


def test_the_table_has_every_backend_once() -> None:
    assert list(BACKENDS) == list(BackendName)
    assert all(name is entry.name for name, entry in BACKENDS.items())


@pytest.mark.parametrize("name", list(BackendName))
def test_each_backend_module_file_defines_its_class(name: BackendName) -> None:
    entry = BACKENDS[name]
    path = ROOT.joinpath(*entry.module.split(".")).with_suffix(".py")
    assert path.is_file(), f"{name.value}: {entry.module} has no file {path}"
    classes = {node.name: node for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(node, ast.ClassDef)}
    assert entry.cls in classes, f"{name.value}: {path} defines no class {entry.cls}"
    # the class says its name through the enum, not a literal
    assigned = [n for n in classes[entry.cls].body if isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "name" for t in n.targets)]
    assert assigned and ast.unparse(assigned[0].value) == f"BackendName.{name.name}.value"


def test_every_model_format_and_kind_has_a_backend() -> None:
    for model_format in ModelFormat:
        assert for_format(model_format.value).model_format == model_format.value
    assert set(BACKEND_FORMAT.values()) == set(ModelFormat)
    for kind in ModelKind:
        assert serving(kind.value), f"no backend serves {kind.value} models"
    assert {k for entry in BACKENDS.values() for k in entry.kinds} <= {k.value for k in ModelKind}


def test_every_classifier_backend_has_its_memory_costs() -> None:
    from runtime.classify.plan import ARENA_FACTOR, RUNTIME_BYTES

    for kind in (ModelKind.VISION, ModelKind.AUDIO):
        for name in serving(kind.value):
            assert name in RUNTIME_BYTES and name in ARENA_FACTOR, f"runtime.classify.plan has no memory cost for {name.value}"


def test_lookups_refuse_unknown_names_in_one_line() -> None:
    with pytest.raises(BadInput, match=r"backend 'tensorrt' is not valid; valid backends: llamacpp, litert, ort, null"):
        spec("tensorrt")
    with pytest.raises(BadInput, match=r"model format 'pt' has no backend \(valid: gguf, tflite, onnx, null\)"):
        for_format("pt")


def test_the_null_backend_is_probed_from_the_table_without_importing_anything() -> None:
    caps = probe("null")
    assert caps.installed and caps.module == BACKENDS[BackendName.NULL].module


def _name_literals(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.strip().lower() in NAMES]


def test_no_module_but_the_table_spells_a_backend_name() -> None:
    found = [hit for folder in SOURCE_DIRS if (ROOT / folder).is_dir()
             for path in sorted((ROOT / folder).rglob("*.py")) if path.relative_to(ROOT) != TABLE
             for hit in _name_literals(path)]
    assert found == [], "compare with devices.backends.BackendName, not a string:\n" + "\n".join(found)


def test_the_literal_check_sees_a_name() -> None:
    probe_file = ROOT / "devices" / "backends.py"
    assert _name_literals(probe_file), "the table itself spells the names, so the check must find them there"


def test_a_classifier_bundle_for_a_backend_that_serves_no_classifier_is_refused_by_the_table(tmp_path: Path) -> None:
    import json

    from runtime.classify.classifier import Classifier
    from tests.runtime.modelgen import vision_bundle

    bundle = vision_bundle(tmp_path / "img", "onnx")
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest.update(backend=BackendName.LLAMACPP.value, model_format=ModelFormat.GGUF.value)
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    valid = ", ".join(b.value for b in serving(ModelKind.VISION.value))
    with pytest.raises(BadInput, match=rf"backend 'llamacpp' is not a classifier backend \(valid: {valid}\)$"):
        Classifier.load(str(bundle), target="cpu", threads=1)
