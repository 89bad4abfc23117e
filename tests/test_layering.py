"""The layers import downward only, read from the source with ``ast``: every import, module-level or inside a
function, relative ones resolved, ``importlib.import_module`` of a literal name, and a module named in a table
(``{"convert": "converters.cli.convert_cmd"}``) to be imported later.

- apps/ (the ``edgerun`` command) may use everything below it;
- runtime/ is a library: nothing from apps/ or converters/;
- devices/ needs of runtime/ only the leaf modules runtime.errors and runtime.units, and nothing from apps/ or
  converters/;
- converters/ import nothing from apps/;
- a backend (runtime/backends/) is told its placement: it never imports devices.placement;
- vision and audio convert through the shared classifier core (converters.classifier): audio never steps into
  vision's own converter (converters.vision.pipeline, converters.vision.front), and the core imports no front end;
- no module imports another package's private name (a leading underscore): ``from pkg.mod import _x``,
  ``mod._x`` on an imported module, or anything from a private module ``pkg._mod``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("apps", "converters", "devices", "runtime")
DEVICES_MAY_USE = ("runtime.errors", "runtime.units")
VISION_FRONT_END = ("converters.vision.pipeline", "converters.vision.front")  # vision's own, beside the shared core


@dataclass(frozen=True)
class Import:
    file: str  # relative to the root
    line: int
    module: str  # the absolute dotted name imported

    def __str__(self) -> str:
        return f"{self.file}:{self.line} imports {self.module}"


def _module_of(path: Path, root: Path) -> list[str]:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def _exists(dotted: str, root: Path) -> bool:
    base = root.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imports_of(path: Path, root: Path) -> list[Import]:
    """Every module ``path`` imports, at any depth of its code, as absolute dotted names."""
    rel = path.relative_to(root).as_posix()
    module = _module_of(path, root)
    package = module if path.name == "__init__.py" else module[:-1]
    found: list[Import] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=rel)):
        if isinstance(node, ast.Import):
            found += [Import(rel, node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # from . import x, from ..errors import y
                base = package[: len(package) - (node.level - 1)]
                name = ".".join([*base, *([node.module] if node.module else [])])
            else:
                name = node.module or ""
            for alias in node.names:  # `from runtime import errors` imports the submodule runtime.errors
                sub = f"{name}.{alias.name}"
                found.append(Import(rel, node.lineno, sub if _exists(sub, root) else name))
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__")))):
            found.append(Import(rel, node.lineno, node.args[0].value))
        elif isinstance(node, (ast.Dict, ast.List, ast.Tuple, ast.Set)):  # a table of modules imported by name later
            for item in node.values if isinstance(node, ast.Dict) else node.elts:
                if (isinstance(item, ast.Constant) and isinstance(item.value, str) and "." in item.value
                        and item.value.split(".")[0] in LAYERS and _exists(item.value, root)):
                    found.append(Import(rel, item.lineno, item.value))
    return sorted(set(found), key=lambda imp: (imp.line, imp.module))


def _within(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def violations(root: Path) -> dict[str, list[Import]]:
    """Each layering rule's offending imports under ``root`` (empty lists when the layers hold)."""
    rules: dict[str, list[Import]] = {
        "runtime/ imports apps/ or converters/": [],
        "devices/ imports runtime/ beyond runtime.errors and runtime.units, or apps/ or converters/": [],
        "converters/ import apps/": [],
        "a backend imports devices.placement instead of being told its placement": [],
        "converters/audio uses vision's converter instead of the shared classifier core": [],
        "the shared classifier core imports a front end": [],
        "an app's engine (not its command body, *_cmd.py) imports the command line apps/cli": [],
    }
    keys = list(rules)
    for layer in LAYERS:
        for path in sorted((root / layer).rglob("*.py")):
            for imp in imports_of(path, root):
                if layer == "runtime" and _within(imp.module, "apps", "converters"):
                    rules[keys[0]].append(imp)
                if layer == "devices" and (_within(imp.module, "apps", "converters")
                                           or (_within(imp.module, "runtime") and not _within(imp.module, *DEVICES_MAY_USE))):
                    rules[keys[1]].append(imp)
                if layer == "converters" and _within(imp.module, "apps"):
                    rules[keys[2]].append(imp)
                if imp.file.startswith("runtime/backends/") and _within(imp.module, "devices.placement"):
                    rules[keys[3]].append(imp)
                if imp.file.startswith("converters/audio/") and _within(imp.module, *VISION_FRONT_END):
                    rules[keys[4]].append(imp)
                if imp.file.startswith("converters/classifier/") and _within(imp.module, "converters.audio", *VISION_FRONT_END):
                    rules[keys[5]].append(imp)
                if (layer == "apps" and not imp.file.startswith("apps/cli/") and not imp.file.endswith("_cmd.py")
                        and imp.file != "apps/__main__.py"
                        and _within(imp.module, "apps.cli")):
                    rules[keys[6]].append(imp)
    return rules


def _report(found: list[Import]) -> str:
    return "\n".join(str(imp) for imp in found)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _package_of(module: str, root: Path) -> str:
    """The package a module belongs to: itself for a package, its parent for a module file."""
    base = root.joinpath(*module.split("."))
    return module if (base / "__init__.py").is_file() else module.rpartition(".")[0]


def _owned_elsewhere(dotted: str, mine: str, root: Path, owner: str | None) -> bool:
    """Whether ``dotted`` names a private first-party name or module that a package other than ``mine`` owns;
    ``owner``: the package owning the last part when it is a name defined in a module."""
    parts = dotted.split(".")
    if parts[0] not in LAYERS:
        return False
    for i, part in enumerate(parts):
        if _private(part):
            last = owner is not None and i == len(parts) - 1
            return (owner if last else _package_of(".".join(parts[:i]), root)) != mine
    return False


def private_imports_of(path: Path, root: Path) -> list[Import]:
    """The private names (leading underscore) of another package that ``path`` imports: a name imported from a
    module (``from pkg.mod import _x``), read off an imported module (``mod._x``, ``pkg.mod._x``), or a private
    module itself (``pkg._mod``). A package's own modules may share its private names."""
    rel = path.relative_to(root).as_posix()
    module = _module_of(path, root)
    package = module if path.name == "__init__.py" else module[:-1]
    mine = ".".join(package)
    found: list[Import] = []
    modules: dict[str, str] = {}  # a name bound to an imported module -> that module
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found += [Import(rel, node.lineno, alias.name)] if _owned_elsewhere(alias.name, mine, root, None) else []
                modules[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join([*package[: len(package) - (node.level - 1)], *([node.module] if node.module else [])]) \
                if node.level else node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if _exists(sub, root):  # a module: a private one is owned by the package above it
                    owner = None
                    modules[alias.asname or alias.name] = sub
                else:  # a name defined in module `base`, owned by that module's package
                    owner = _package_of(base, root) if _exists(base, root) else None
                found += [Import(rel, node.lineno, sub)] if _owned_elsewhere(sub, mine, root, owner) else []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            chain, value = [], node.value
            while isinstance(value, ast.Attribute):
                chain.insert(0, value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in modules:
                target = ".".join([modules[value.id], *chain])
                if _exists(target, root) and _owned_elsewhere(f"{target}.{node.attr}", mine, root, _package_of(target, root)):
                    found.append(Import(rel, node.lineno, f"{target}.{node.attr}"))
    return found


def private_imports(root: Path) -> list[Import]:
    """Every private name of another package imported under the layers (:func:`private_imports_of`)."""
    found = [imp for layer in LAYERS for path in sorted((root / layer).rglob("*.py")) for imp in private_imports_of(path, root)]
    return sorted(set(found), key=lambda imp: (imp.file, imp.line, imp.module))


def test_the_layers_import_downward_only() -> None:
    for rule, found in violations(ROOT).items():
        assert not found, f"{rule}:\n{_report(found)}"


def test_no_module_imports_another_packages_private_name() -> None:
    found = private_imports(ROOT)
    assert not found, f"private names imported from another package:\n{_report(found)}"


def test_every_layer_is_read() -> None:
    # A layer renamed or emptied would make the rules above hold vacuously.
    for layer in LAYERS:
        assert any(imports_of(p, ROOT) for p in (ROOT / layer).rglob("*.py")), f"no imports read under {layer}/"


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for layer in LAYERS:
        (root / layer).mkdir(exist_ok=True)
        (root / layer / "__init__.py").touch()
    return root


def test_function_level_relative_and_dynamic_imports_are_caught(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "runtime/errors.py": "",
        "runtime/units.py": "from runtime.errors import BadInput\n",
        "runtime/llm.py": "def load():\n    from converters.llm import convert\n",
        "converters/llm.py": "",
        "runtime/backends/__init__.py": "",
        "runtime/backends/ort.py": "def offload():\n    from devices.placement import Offload\n",
        "runtime/classifier.py": "import importlib\nimportlib.import_module('apps.cli')\n",
        "runtime/cli.py": "COMMANDS = {\n    'run': 'runtime.llm',\n    'convert': 'converters.llm',\n}\n",
        "devices/ok.py": "from runtime.errors import BadInput\nfrom runtime import units\n",
        "devices/placement.py": "from runtime import llm\nclass P:\n    def f(self):\n        import runtime\n",
        "devices/link/__init__.py": "",
        "devices/link/peer.py": "from ...runtime.backends import ort\n",
        "converters/vision/__init__.py": "",
        "converters/vision/cli.py": "from ..vision import x\nfrom apps.cli.common import print_json\n",
        "apps/cli/__init__.py": "from runtime.llm import load\nfrom converters.vision import cli\n",
        "converters/vision/pipeline.py": "",
        "converters/audio/__init__.py": "",
        "converters/audio/pipeline.py": "from converters.vision.pipeline import build_quantized\n",
        "converters/classifier/__init__.py": "",
        "converters/classifier/core.py": "def convert():\n    from converters.audio import pipeline\n",
        "apps/__init__.py": "",
        "apps/__main__.py": "from apps.cli import main\n",
        "apps/kiosk/__init__.py": "",
        "apps/kiosk/dashboard.py": "def serve():\n    from apps.cli.serve_cmd import listen\n",
        "apps/kiosk/run_cmd.py": "from apps.cli.flags import integer\n",
    })
    found = {rule: [str(imp) for imp in imps] for rule, imps in violations(root).items()}
    assert list(found.values()) == [
        ["runtime/classifier.py:2 imports apps.cli", "runtime/cli.py:3 imports converters.llm",
         "runtime/llm.py:2 imports converters.llm"],
        ["devices/link/peer.py:1 imports runtime.backends.ort", "devices/placement.py:1 imports runtime.llm",
         "devices/placement.py:4 imports runtime"],
        ["converters/vision/cli.py:2 imports apps.cli.common"],
        ["runtime/backends/ort.py:2 imports devices.placement"],
        ["converters/audio/pipeline.py:1 imports converters.vision.pipeline"],
        ["converters/classifier/core.py:2 imports converters.audio.pipeline"],
        ["apps/kiosk/dashboard.py:2 imports apps.cli.serve_cmd"],
    ], found


def test_private_names_of_another_package_are_caught(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "runtime/classifier.py": "def _check_quant(): ...\n",
        "runtime/audio_classifier.py": "from runtime.classifier import _check_quant\nfrom . import classifier\nclassifier._x\n",
        "runtime/backends/__init__.py": "",
        "runtime/backends/ort.py": "from ..classifier import _check_quant\nfrom llama_cpp import _logger\n",  # 2: not ours
        "converters/vision/__init__.py": "",
        "converters/vision/pipeline.py": "def _arena_bytes(): ...\n",
        "converters/vision/_routes.py": "",
        "converters/audio/__init__.py": "",
        "converters/audio/pipeline.py": (
            "def f():\n    from converters.vision.pipeline import _arena_bytes\n"
            "from converters.vision import pipeline as vp\nvp._arena_bytes()\nvp.__name__\n"
            "import converters.vision._routes\nfrom converters.vision._routes import build\n"
            "import runtime.classifier\nruntime.classifier._check_quant()\n"
        ),
        "apps/cli.py": "from runtime import classifier\nclassifier._check_quant()\nclassifier.load()\n",
    })
    assert [str(imp) for imp in private_imports(root)] == [
        "apps/cli.py:2 imports runtime.classifier._check_quant",
        "converters/audio/pipeline.py:2 imports converters.vision.pipeline._arena_bytes",
        "converters/audio/pipeline.py:4 imports converters.vision.pipeline._arena_bytes",
        "converters/audio/pipeline.py:6 imports converters.vision._routes",
        "converters/audio/pipeline.py:7 imports converters.vision._routes.build",
        "converters/audio/pipeline.py:9 imports runtime.classifier._check_quant",
        "runtime/backends/ort.py:1 imports runtime.classifier._check_quant",
    ]


def test_the_backends_read_the_runtime_only_through_small_types() -> None:
    # A backend is one file that wraps one native library: of the rest of runtime/ it takes errors, units, the
    # checks a file passes before native code opens it (files, formats) and the sampling parameters it applies.
    # What it is told to build (a ContextPlan, a Placed) it reads structurally, so the planner and the placement
    # can change without the backends importing them.
    allowed = ("runtime.backends", "runtime.errors", "runtime.units", "runtime.files", "runtime.formats",
               "runtime.llm.sampling")
    found = [imp for path in sorted((ROOT / "runtime" / "backends").rglob("*.py")) for imp in imports_of(path, ROOT)
             if _within(imp.module, "runtime") and not _within(imp.module, *allowed)]
    assert found == [], _report(found)


def test_runtime_is_in_rooms() -> None:
    # runtime/'s root holds the rooms and the few modules every room shares; a new module goes into its room.
    root = sorted(p.name for p in (ROOT / "runtime").iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file())
    shared = [name for name in root if name.endswith(".py") and name != "__init__.py"]
    assert shared == ["errors.py", "files.py", "metrics.py", "units.py"], shared
    assert len(root) <= 13, root
