"""No import cycles among runtime/ modules, read from the source with ``ast``.

Every ``import`` is listed, in two groups: module-level (run when the module is
imported) and function-level (run when the function is called, the usual way to
hide a cycle). Imports under ``if TYPE_CHECKING:`` never run and are left out.
The cycle check uses the module-level imports; the function-level ones are
checked too, so a cycle cannot come back by moving an import into a function.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "runtime"


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


def imports_of(path: Path) -> tuple[set[str], set[str]]:
    """(module-level, function-level) imports of the file at ``path``, TYPE_CHECKING blocks left out."""
    module = _module_name(path)
    is_package = path.name == "__init__.py"
    top: set[str] = set()
    inner: set[str] = set()

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(ast.Module(body=[sub], type_ignores=[]), in_function)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                (inner if in_function else top).update(_targets(child, module, is_package))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(path.read_text(), str(path)), False)
    return top, inner


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}


def _graph(level: str) -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        top, inner = imports_of(path)
        found = top if level == "module" else top | inner
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


def test_the_reader_lists_module_and_function_level_imports_apart(tmp_path: Path) -> None:
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
        "def f():\n"
        "    from runtime.d import D\n"
    )
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        top, inner = imports_of(src)
    finally:
        ROOT = saved
    assert {"runtime.a", "runtime.b", "runtime.c"} <= top
    assert "runtime.d" in inner and "runtime.d" not in top
    assert not any("hidden" in name for name in top | inner)


def test_find_cycle_sees_the_old_llm_chat_cycle() -> None:
    # The shape this test exists to refuse: llm imports chat, chat imports llm back.
    assert find_cycle({"runtime.llm": {"runtime.chat"}, "runtime.chat": {"runtime.llm"}}) == [
        "runtime.chat", "runtime.llm", "runtime.chat"]
    assert find_cycle({"runtime.llm": {"runtime.chat"}, "runtime.chat": {"runtime.generation"}}) is None


def test_runtime_modules_import_no_cycle_at_module_level() -> None:
    graph = _graph("module")
    assert graph["runtime.llm.model"], "the reader found no imports in runtime/llm/model.py"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle among runtime modules: " + " -> ".join(cycle or [])


def test_runtime_modules_import_no_cycle_even_through_function_level_imports() -> None:
    cycle = find_cycle(_graph("all"))
    assert cycle is None, "import cycle among runtime modules (counting imports inside functions): " + " -> ".join(cycle or [])
