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


def test_optional_imports_go_through_runtime_errors_require() -> None:
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


# --- percentiles: one helper, each caller naming its method ------------------------------------------------------

# Where the percentile guard looks. converters/ is left out on purpose: its quantiles (the KL p99 and the cosine p01
# of a quality gate, the good scores' threshold of an anomaly bundle) are statistics of a model's outputs, each
# defined by its gate's documentation and read by nothing else; runtime.metrics.percentile is for the reports of
# what a user or a line waited (latencies, rates), where two "p95" must mean the same thing.
PERCENTILE_PACKAGES = ("runtime", "apps", "devices")
PERCENTILE_HOME = "runtime.metrics"
# numpy's and statistics' percentile functions (torch's and pandas' quantile too, by the method's name). The
# median (numpy.median, statistics.median) is left alone: the mean of the middle two is the one definition both
# libraries and every reader share, so there is no method to choose.
PERCENTILE_CALLS = {"percentile", "nanpercentile", "quantile", "nanquantile", "quantiles", "median_low", "median_high",
                    "median_grouped"}


def _function_of(tree: ast.AST) -> dict[ast.AST, str]:
    """Each node -> the name of the innermost function around it (``<module>`` outside any)."""
    where: dict[ast.AST, str] = {}

    def visit(node: ast.AST, name: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else name
            where[child] = inner
            visit(child, inner)

    visit(tree, "<module>")
    return where


def percentile_code(tree: ast.AST) -> list[tuple[str, str]]:
    """``(function, what)`` for each piece of percentile code in a module: a function named for a percentile or a
    quantile, a call of a library's percentile function (:data:`PERCENTILE_CALLS`, whatever it was imported as,
    except runtime.metrics' own), and a hand-made nearest rank (a subscript whose index rounds something of a
    ``len()`` with ``ceil`` or ``floor``, as ``sorted(v)[ceil(0.95 * len(v)) - 1]``)."""
    home: set[str] = set()  # names bound to the runtime.metrics module
    origin: dict[str, str] = {}  # a name imported with ``from M import x [as name]`` -> "M.x"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            home |= {a.asname for a in node.names if a.name == PERCENTILE_HOME and a.asname}
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                origin[a.asname or a.name] = f"{node.module}.{a.name}"
                if f"{node.module}.{a.name}" == PERCENTILE_HOME:
                    home.add(a.asname or a.name)
    where = _function_of(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and re.search("percentile|quantile", node.name, re.I):
            found.append((node.name, "def"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in PERCENTILE_CALLS:
            if not (isinstance(node.func.value, ast.Name) and node.func.value.id in home):
                found.append((where[node], ast.unparse(node.func)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            imported = origin.get(node.func.id, node.func.id)  # the function's own name, whatever it is called here
            if imported.rpartition(".")[2] in PERCENTILE_CALLS and imported != f"{PERCENTILE_HOME}.percentile":
                found.append((where[node], node.func.id))
        elif isinstance(node, ast.Subscript):
            rounded = [c for c in ast.walk(node.slice) if isinstance(c, ast.Call)
                       and (getattr(c.func, "attr", None) or getattr(c.func, "id", None)) in ("ceil", "floor")]
            if any(isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == "len"
                   for r in rounded for c in ast.walk(r)):
                found.append((where[node], "nearest rank by hand"))
    return found


@pytest.mark.parametrize("src, found", [
    ("import numpy as np\ndef p(v):\n    return np.percentile(v, 50)\n", [("p", "np.percentile")]),
    ("from numpy import quantile as q\ndef p(v):\n    return q(v, 0.5)\n", [("p", "q")]),
    ("import statistics\nx = statistics.quantiles([1, 2, 3])\n", [("<module>", "statistics.quantiles")]),
    ("def p95(v):\n    o = sorted(v)\n    return o[max(0, math.ceil(0.95 * len(o)) - 1)]\n", [("p95", "nearest rank by hand")]),
    ("def _percentile(v, q):\n    return v[0]\n", [("_percentile", "def")]),
    ("from runtime.metrics import percentile\ny = percentile([1.0], 50, method='linear')\n", []),
    ("from runtime import metrics\ny = metrics.percentile([1.0], 50, method='linear')\n", []),
    ("import numpy as np\ny = np.median([1.0, 2.0])\n", []),
])
def test_the_percentile_reader_finds_each_shape(src: str, found: list[tuple[str, str]]) -> None:
    assert percentile_code(ast.parse(src)) == found


def test_percentiles_are_computed_in_one_place() -> None:
    # The kiosk's dashboard and pipeline, the voice session's summary, the load test, `edgerun bench` and the
    # server's canary each computed their own (numpy's linear method in four, nearest rank in two); now each calls
    # runtime.metrics.percentile and names its method there.
    found = [f"{p.relative_to(ROOT).as_posix()}:{function}:{what}" for d in PERCENTILE_PACKAGES
             for p in sorted((ROOT / d).rglob("*.py")) for function, what in percentile_code(ast.parse(p.read_text()))]
    assert sorted(found) == ["runtime/metrics.py:percentile:def", "runtime/metrics.py:percentile:nearest rank by hand",
                             "runtime/metrics.py:percentile:np.percentile"]


# --- a missing optional package: one wording -------------------------------------------------------------------


def _strings(node: ast.AST) -> str:
    return " ".join(n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str))


def test_a_missing_package_is_worded_in_one_function() -> None:
    # runtime.errors.not_installed words it; missing() (an edgerun extra) and runtime.errors.require (any pip
    # line, with what needs it and which import actually failed) both call it.
    builders = [f"{p.relative_to(ROOT).as_posix()}:{node.name}" for p, src in _sources().items()
                for node in ast.walk(ast.parse(src)) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and "not installed" in _strings(node) and "install it with" in _strings(node)]
    assert builders == ["runtime/errors.py:not_installed"]


def test_a_failed_import_is_refused_through_the_one_wording() -> None:
    # A MissingDependency built by hand where an import failed is the second wording coming back: use
    # runtime.errors.not_installed / missing, or runtime.errors.require.
    import_errors = {"ImportError", "ModuleNotFoundError"}
    found = []
    for p, src in _sources().items():
        for handler in ast.walk(ast.parse(src)):
            if not isinstance(handler, ast.ExceptHandler) or handler.type is None:
                continue
            caught = {n.id for n in ast.walk(handler.type) if isinstance(n, ast.Name)}
            if caught & import_errors:
                found += [f"{p.relative_to(ROOT).as_posix()}:{node.lineno}" for node in ast.walk(handler)
                          if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "MissingDependency"]
    assert found == []


# --- one line of an error ----------------------------------------------------------------------------------------


def test_one_line_is_defined_once() -> None:
    # runtime.errors.one_line folds a message onto one line; the CLI's dispatcher calls it with escape=True (its
    # own copy, which also escaped control characters, is gone).
    where = [p.relative_to(ROOT).as_posix() for p, src in _sources().items() for node in ast.walk(ast.parse(src))
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "one_line"]
    assert where == ["runtime/errors.py"]
