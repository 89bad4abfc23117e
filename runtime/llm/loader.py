"""The load path shared by every LLM entry point (runtime.llm.model.LLM, runtime.serving.engine.Engine): check, plan, place, open.

Order matters: the GGUF header is validated in Python, the memory plan is made
(and refused) before anything is allocated, the placement is resolved (and
refused under ``require_accelerator``) before the backend library is imported.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devices.backends import BackendName
from runtime.bundle.manifest import ModelKind
from runtime.bundle.resolve import ResolvedModel, resolve
from runtime.errors import BadInput
from runtime.formats.gguf_file import read_gguf
from runtime.llm.plan import KVType, MemoryPlan, default_budget, plan_llm
from runtime.llm.plan_device import split_by_device
from runtime.units import parse_size

if TYPE_CHECKING:
    from devices.placement import Placement
    from runtime.backends.base import Placed

log = logging.getLogger(__name__)

BackendFactory = Callable[[Path, MemoryPlan, "Placed"], Any]


@dataclass(frozen=True)
class OpenedLLM:
    """What an LLM entry point is built on: the memory plan, the open backend (the caller owns it and closes it)
    and the placement with the offload llama.cpp measured."""

    model: ResolvedModel
    plan: MemoryPlan
    backend: Any
    placement: Placement
    draft: Any = None  # runtime.llm.draft.DraftModel when a draft model was asked for (the caller owns it and closes it)


def open_llm(
    model: str | ResolvedModel,
    *,
    memory: int | str | None,
    ctx: int | None,
    kv_type: KVType | str | None,
    threads: int | None,
    target: str,
    require_accelerator: bool,
    prefix_cache_bytes: int | None,
    slots: int = 1,
    backend: BackendFactory | None = None,
    draft: str | ResolvedModel | None = None,
    bundle_draft: bool = False,
) -> OpenedLLM:
    """Resolve ``model`` and open its GGUF within ``memory`` (bytes or a size; None: the default budget).
    ``slots``: sequences decoded together (runtime.llm.plan.plan_llm); ``backend``: what opens the file, called as
    ``backend(path, plan, placement)`` (None: the registry's llama.cpp backend, runtime.backends.open_backend).
    ``draft``: a draft model for speculative decoding (runtime/llm/draft.py), planned, checked and opened beside;
    ``bundle_draft``: without ``draft``, the bundle's own draft model (manifest ``llm.draft``) if it has one."""
    model = resolve(model) if isinstance(model, str) else model
    budget = parse_size(memory) if isinstance(memory, str) else (memory or default_budget())
    kv_type = KVType(kv_type) if isinstance(kv_type, str) else kv_type
    manifest = model.manifest
    if manifest.kind != ModelKind.LLM or manifest.backend != BackendName.LLAMACPP:
        raise BadInput(f"{manifest.ref} is a {manifest.kind.value} model for {manifest.backend.value}; "
                       "this command runs GGUF language models")
    draft_model = None
    if draft is not None:
        from runtime.llm.draft import resolve_draft

        draft_model = resolve_draft(draft)
    own_draft = manifest.llm.draft if draft is None and bundle_draft and manifest.llm else None
    with contextlib.ExitStack() as undo:
        # The header check, the plan and llama.cpp all read the one file that was verified (runtime.bundle.checked_open).
        with contextlib.ExitStack() as files:
            (weights,) = files.enter_context(model.opened(manifest.file("weights").path))
            info = read_gguf(weights)
            draft_info = draft_path = None
            draft_name = ""
            if draft_model is not None:
                (draft_path,) = files.enter_context(draft_model.opened(draft_model.manifest.file("weights").path))
                draft_name = draft_model.manifest.ref
            elif own_draft is not None:
                (draft_path,) = files.enter_context(model.opened(own_draft))
                draft_name = f"{manifest.ref}/{own_draft}"
            if draft_path is not None:
                draft_info = read_gguf(draft_path)
            plan = plan_llm(info, budget, name=manifest.ref, ctx=ctx, kv_type=kv_type, prefix_cache_bytes=prefix_cache_bytes,
                            slots=slots, draft=draft_info, draft_name=draft_name)
            from devices.placement import resolve_placement

            n_layers = int(info.arch_value("block_count", 0) or 0)
            placement = resolve_placement(BackendName.LLAMACPP, target, require_accelerator=require_accelerator, threads=threads,
                                          n_layers=n_layers)
            if draft_path is not None:
                from runtime.llm.draft import check_same_vocab

                check_same_vocab(weights, draft_path, manifest.ref, plan.draft.model)  # before anything is allocated
            if backend is None:
                from runtime.backends import open_backend  # imports llama.cpp only now, once placement allowed it

                opened = open_backend(BackendName.LLAMACPP, weights, plan, placement)
            else:
                opened = backend(weights, plan, placement)
            undo.callback(opened.close)
            opened_draft = None
            if draft_path is not None:
                from runtime.llm.draft import DraftModel

                opened_draft = DraftModel.open(draft_path, plan, placement)
                undo.callback(opened_draft.close)
        placement = placement.loaded(opened.offload(), require_accelerator=require_accelerator)  # measured by llama.cpp
        undo.pop_all()
    if placement.offload is not None and placement.offload.on_accelerator:  # host and device memory apart (issue 20)
        from devices.gpu_memory import unified_memory

        plan = plan.with_device(split_by_device(plan, info, placement.offload.on_accelerator, unified=unified_memory(),
                                                draft=draft_info))
    if slots == 1:
        log.info("%s", placement.summary())
    else:
        log.info("%s; %d slots of %d tokens", placement.summary(), plan.n_slots, plan.slot_ctx)
    if opened_draft is not None:
        log.info("draft model %s for speculative decoding, %d tokens of context", opened_draft.ref, opened_draft.n_ctx)
    return OpenedLLM(model, plan, opened, placement, opened_draft)

