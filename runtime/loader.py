"""The load path shared by every LLM entry point: check, plan, place, open.

Order matters: the GGUF header is validated in Python, the memory plan is made
(and refused) before anything is allocated, the placement is resolved (and
refused under ``require_accelerator``) before the backend library is imported.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

from devices.backends import BackendName
from runtime.bundle import ModelKind
from runtime.errors import BadInput
from runtime.gguf_file import read_gguf
from runtime.plan import KVType, plan_llm
from runtime.resolve import ResolvedModel

if TYPE_CHECKING:
    from runtime.llm import LLM

log = logging.getLogger(__name__)


def open_llm(
    cls: type[LLM],
    model: ResolvedModel,
    budget: int,
    *,
    ctx: int | None,
    kv_type: KVType | None,
    threads: int | None,
    target: str,
    require_accelerator: bool,
    prefix_cache_bytes: int | None,
) -> LLM:
    manifest = model.manifest
    if manifest.kind != ModelKind.LLM or manifest.backend != BackendName.LLAMACPP:
        raise BadInput(f"{manifest.ref} is a {manifest.kind.value} model for {manifest.backend.value}; "
                       "this command runs GGUF language models")
    with contextlib.ExitStack() as undo:
        # The header check, the plan and llama.cpp all read the one file that was verified (runtime.checked_open).
        with model.opened(manifest.file("weights").path) as (weights,):
            info = read_gguf(weights)
            plan = plan_llm(info, budget, name=manifest.ref, ctx=ctx, kv_type=kv_type, prefix_cache_bytes=prefix_cache_bytes)
            from devices.placement import resolve_placement

            n_layers = int(info.arch_value("block_count", 0) or 0)
            placement = resolve_placement(BackendName.LLAMACPP, target, require_accelerator=require_accelerator, threads=threads,
                                          n_layers=n_layers)
            from runtime.backends import open_backend  # imports llama.cpp only now, once placement allowed it

            backend = open_backend(BackendName.LLAMACPP, weights, plan, placement)
            undo.callback(backend.close)
        placement = placement.loaded(backend.offload(), require_accelerator=require_accelerator)  # measured by llama.cpp
        undo.pop_all()
    log.info("%s", placement.summary())
    return cls(model, plan, backend, placement)

