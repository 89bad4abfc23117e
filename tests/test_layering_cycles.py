"""No import cycles among the modules of runtime/, apps/, devices/, converters/ and models/, read with ``ast``.

Every ``import`` is listed, in three groups: module-level (run when the module is imported), function-level
(run when the function is called, the usual way to hide a cycle) and type-only (under ``if TYPE_CHECKING:``,
never run, read by type checkers and people). Three checks, each counting one more group: module-level imports
alone; those and the function-level ones, so a cycle cannot come back by moving an import into a function; and
all three, so a cycle cannot hide under TYPE_CHECKING either (two modules that each need the other's types to
be read are one module cut in the wrong place, or a shared type that belongs in a third). Imports between the
packages count too: runtime -> devices -> runtime is a cycle like any other.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("runtime", "apps", "devices", "converters", "models")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: resolve against the importing module's package
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    # ``from runtime import chat`` imports the module runtime.chat; ``from runtime.chat import X`` imports runtime.chat.
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def read_imports(path: Path) -> tuple[set[str], set[str], set[str]]:
    """(module-level, function-level, type-only) imports of the file at ``path``.

    Type-only: under ``if TYPE_CHECKING:`` (its ``else:`` runs, so it counts as code); an import there inside a
    function is type-only too."""
    module = _module_name(path)
    is_package = path.name == "__init__.py"
    top: set[str] = set()
    inner: set[str] = set()
    typed: set[str] = set()

    def visit(node: ast.AST, in_function: bool, type_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.body:
                    visit(ast.Module(body=[sub], type_ignores=[]), in_function, True)
                for sub in child.orelse:
                    visit(ast.Module(body=[sub], type_ignores=[]), in_function, type_only)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                (typed if type_only else inner if in_function else top).update(_targets(child, module, is_package))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)), type_only)

    visit(ast.parse(path.read_text(), str(path)), False, False)
    return top, inner, typed


def imports_of(path: Path) -> tuple[set[str], set[str]]:
    """(module-level, function-level) imports of the file at ``path``, TYPE_CHECKING blocks left out."""
    top, inner, _ = read_imports(path)
    return top, inner


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


LEVELS = ("module", "function", "type")  # each counts the imports of the ones before it too


def _graph(level: str) -> dict[str, set[str]]:
    assert level in LEVELS, level
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        top, inner, typed = read_imports(path)
        found = top | (inner if level != "module" else set()) | (typed if level == "type" else set())
        graph[name] = {t for t in found if t in modules and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := walk(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := walk(start)):
            return cycle
    return None


def test_the_reader_lists_module_function_level_and_type_only_imports_apart(tmp_path: Path) -> None:
    pkg = tmp_path / "runtime"
    pkg.mkdir()
    src = pkg / "m.py"
    src.write_text(
        "from typing import TYPE_CHECKING\n"
        "import runtime.a\n"
        "from runtime import b\n"
        "from . import c\n"
        "if TYPE_CHECKING:\n"
        "    from runtime.hidden import H\n"
        "else:\n"
        "    import runtime.e\n"
        "def f():\n"
        "    from runtime.d import D\n"
    )
    (pkg / "hidden.py").write_text("from runtime.m import f\n")
    global ROOT, PACKAGES
    saved, ROOT, saved_packages, PACKAGES = ROOT, tmp_path, PACKAGES, ("runtime",)
    try:
        top, inner = imports_of(src)
        typed = read_imports(src)[2]
        graphs = {level: _graph(level) for level in LEVELS}
    finally:
        ROOT, PACKAGES = saved, saved_packages
    assert {"runtime.a", "runtime.b", "runtime.c", "runtime.e"} <= top
    assert "runtime.d" in inner and "runtime.d" not in top
    assert not any("hidden" in name for name in top | inner)
    assert typed == {"runtime.hidden", "runtime.hidden.H"}
    # m -> hidden under TYPE_CHECKING, hidden -> m at module level: only the type-only check counts the cycle.
    assert find_cycle(graphs["module"]) is None and find_cycle(graphs["function"]) is None
    assert find_cycle(graphs["type"]) == ["runtime.hidden", "runtime.m", "runtime.hidden"]


def test_find_cycle_sees_the_old_llm_chat_cycle() -> None:
    # The shape this test exists to refuse: llm imports chat, chat imports llm back.
    assert find_cycle({"runtime.llm": {"runtime.chat"}, "runtime.chat": {"runtime.llm"}}) == [
        "runtime.chat", "runtime.llm", "runtime.chat"]
    assert find_cycle({"runtime.llm": {"runtime.chat"}, "runtime.chat": {"runtime.generation"}}) is None


def test_the_reader_sees_every_package() -> None:
    graph = _graph("module")
    for package in PACKAGES:
        names = [name for name in graph if name.split(".")[0] == package]
        assert names, f"no module read under {package}/"
        # models/ holds recipes (TOML) and a package docstring today: a package of one file may import nothing
        assert len(names) == 1 or any(graph[name] for name in names), f"no imports read under {package}/"
    assert "apps.kiosk.camera" in graph["apps.kiosk.sources"], "the reader found no imports in apps/kiosk/sources.py"
    assert graph["runtime.llm.model"], "the reader found no imports in runtime/llm/model.py"


def test_no_import_cycle_at_module_level() -> None:
    cycle = find_cycle(_graph("module"))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_import_cycle_even_through_function_level_imports() -> None:
    cycle = find_cycle(_graph("function"))
    assert cycle is None, "import cycle (counting imports inside functions): " + " -> ".join(cycle or [])


def test_no_import_cycle_even_through_type_only_imports() -> None:
    cycle = find_cycle(_graph("type"))
    assert cycle is None, "import cycle (counting imports inside functions and under TYPE_CHECKING): " + " -> ".join(cycle or [])
