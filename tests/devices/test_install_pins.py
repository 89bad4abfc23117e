"""A backend package's pinned version is written once in runtime/ and devices/: in the backend table
(devices/backends.py), at the version pyproject.toml's extras pin. Every install line and message is made from it,
so a version bump in pyproject.toml has one place to follow it."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

from devices.backends import BACKENDS, BackendName
from devices.capabilities import BackendCaps
from devices.doctor import LLAMA_CUDA
from devices.placement import CUDA_BUILD

ROOT = Path(__file__).resolve().parents[2]
TABLE = "devices/backends.py"
PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][0-9A-Za-z.+!-]*)")


def _extras_pins() -> dict[str, str]:
    """Package -> version, as pyproject.toml's optional dependencies pin them (one version each)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins: dict[str, set[str]] = {}
    for requirement in (r for reqs in extras.values() for r in reqs):
        found = PIN.fullmatch(requirement)
        if found:
            pins.setdefault(found[1].lower(), set()).add(found[2])
    assert all(len(v) == 1 for v in pins.values()), f"pyproject.toml pins a package at two versions: {pins}"
    return {name: v.pop() for name, v in pins.items()}


def _pins_in_strings(path: Path) -> list[tuple[int, str]]:
    """(line, 'package==version') for each pinned requirement written in a string of ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out += [(node.lineno, m[0]) for m in PIN.finditer(node.value)]
    return out


def test_the_table_pins_each_backend_package_as_pyproject_does() -> None:
    pins = _extras_pins()
    for spec in BACKENDS.values():
        if not spec.requirement:
            continue
        name, version = PIN.fullmatch(spec.requirement).groups()
        assert pins.get(name.lower()) == version, f"{spec.name.value}: {spec.requirement}, pyproject.toml pins {pins.get(name.lower())}"


def test_no_second_copy_of_a_pin_in_runtime_or_devices() -> None:
    pins = _extras_pins()
    found = [f"{path.relative_to(ROOT).as_posix()}:{line} {pin}"
             for top in ("runtime", "devices") for path in sorted((ROOT / top).rglob("*.py"))
             for line, pin in _pins_in_strings(path)]
    table = [f for f in found if f.startswith(TABLE + ":")]
    others = [f for f in found if not f.startswith(TABLE + ":")]
    assert others == [], "pinned versions outside the backend table; make the message from devices.backends.BACKENDS"
    assert len(table) == len({f.split()[1] for f in table}), f"a pin written twice in the table: {table}"
    assert {f.split()[1].split("==")[0].lower() for f in table} <= set(pins)


@pytest.mark.parametrize("name", [b for b in BACKENDS if BACKENDS[b].requirement], ids=lambda b: b.value)
def test_install_lines_carry_the_tables_pin(name: BackendName) -> None:
    spec = BACKENDS[name]
    caps = BackendCaps(name, installed=False)
    assert spec.requirement in spec.install and caps.install == spec.install
    assert caps.to_dict()["install"] == spec.install
    if name is BackendName.LITERT:
        from runtime.backends.litert import INSTALL
    elif name is BackendName.ORT:
        from runtime.backends.ort import INSTALL
    else:
        INSTALL = spec.install
    assert INSTALL == spec.install


def test_the_gpu_build_line_is_the_tables() -> None:
    build = BACKENDS[BackendName.LLAMACPP].gpu_build
    assert BACKENDS[BackendName.LLAMACPP].requirement in build and "GGML_CUDA=on" in build
    assert LLAMA_CUDA == build and CUDA_BUILD == f"build with {build}"
