"""Summed residency plans against measured RSS, several LLMs in one process (runtime.residency.manager's docstring).

Loads SmolLM2 Q4_1, a second SmolLM2 (a second llama.cpp context of the same file) and Gemma 3 270M one after
another through one ResidencyManager (ctx 512, f16 KV, 8 MiB prefix cache, one thread; runtime.serving.engine.Engine
with its default slots when present, else runtime.llm.model.LLM), generates 8 tokens
with each so that its weights are touched, and reports after each load the RSS the model added against its
own plan (its total less the runtime term, which the manager counts once), and the process RSS against the
manager's sum. Prints JSON; the models are built into the store on first use.

    .venv/bin/python bench/residency_memory.py
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("OMP_NUM_THREADS", "1")

MiB = 1 << 20


def main() -> None:
    from runtime.metrics import rss_bytes
    from runtime.residency.manager import ModelSpec, ResidencyManager

    options = {"ctx": 512, "kv_type": "f16", "prefix_cache_bytes": 8 * MiB, "threads": 1}
    rows = []
    with ResidencyManager(2 << 30) as models:
        for name, ref in (("smol", "default"), ("smol2", "default"), ("gemma", "gemma3-270m")):
            models.add(ModelSpec(name, ref, "llm", options=options))
            before = rss_bytes()
            with models.acquire(name) as llm:
                tokens, params = llm.tokenize("hello there, how are you"), llm.params(max_tokens=8, temperature=0.0)
                if hasattr(llm, "submit"):  # runtime.serving.engine.Engine (the default loader's choice when present)
                    from runtime.serving.engine import GenRequest

                    llm.generate(GenRequest(tokens, params))
                else:
                    llm.generate(tokens, params)
                own = models.planned_bytes(name) - llm.plan.runtime_bytes
            rows.append({"model": name, "own_plan_mib": round(own / MiB, 1),
                         "rss_added_mib": round((rss_bytes() - before) / MiB, 1),
                         "process_rss_mib": round(rss_bytes() / MiB, 1),
                         "summed_plans_mib": round(models.used_bytes() / MiB, 1), "loaded_as": type(llm).__name__,
                         "slots": getattr(llm.plan, "n_slots", 1)})
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
