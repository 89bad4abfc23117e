"""The layers import downward only, read from the source with ``ast``: every import, module-level or inside a
function, relative ones resolved, ``importlib.import_module`` of a literal name, and a module named in a table
(``{"convert": "converters.cli.convert_cmd"}``) to be imported later.

- apps/ (the ``edgerun`` command) may use everything below it;
- runtime/ is a library: nothing from apps/ or converters/;
- devices/ needs of runtime/ only the leaf modules runtime.errors and runtime.units, and nothing from apps/ or
  converters/;
- converters/ import nothing from apps/;
- a backend (runtime/backends/) is told its placement: it never imports devices.placement.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("apps", "converters", "devices", "runtime")
DEVICES_MAY_USE = ("runtime.errors", "runtime.units")


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
    return rules


def _report(found: list[Import]) -> str:
    return "\n".join(str(imp) for imp in found)


def test_the_layers_import_downward_only() -> None:
    for rule, found in violations(ROOT).items():
        assert not found, f"{rule}:\n{_report(found)}"


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
    })
    found = {rule: [str(imp) for imp in imps] for rule, imps in violations(root).items()}
    assert list(found.values()) == [
        ["runtime/classifier.py:2 imports apps.cli", "runtime/cli.py:3 imports converters.llm",
         "runtime/llm.py:2 imports converters.llm"],
        ["devices/link/peer.py:1 imports runtime.backends.ort", "devices/placement.py:1 imports runtime.llm",
         "devices/placement.py:4 imports runtime"],
        ["converters/vision/cli.py:2 imports apps.cli.common"],
        ["runtime/backends/ort.py:2 imports devices.placement"],
    ], found
