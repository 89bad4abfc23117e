"""The voice assistant's modules import one way: no cycle among apps/voice, counting imports inside functions.

The cycle this exists for: apps/voice/models.py took ESPEAK from apps/voice/plan.py while plan.py took the wake
word's hop from models.py inside hop_windows(). The hop is part of the plan (it fixes the windows one score holds),
so it lives in plan.py and models.py reads both from there.
"""

from __future__ import annotations

from pathlib import Path

from tests.test_layering_cycles import _module_name, find_cycle, imports_of

VOICE = Path(__file__).resolve().parents[3] / "apps" / "voice"


def test_apps_voice_modules_import_no_cycle_even_through_function_level_imports() -> None:
    modules = {_module_name(p): p for p in sorted(VOICE.glob("*.py"))}
    graph = {}
    for name, path in modules.items():
        top, inner = imports_of(path)
        graph[name] = {t for t in top | inner if t in modules and t != name}
    assert "apps.voice.plan" in graph["apps.voice.models"], "the reader found no imports in apps/voice/models.py"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle among apps/voice modules: " + " -> ".join(cycle or [])
