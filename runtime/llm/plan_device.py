"""Where an LLM plan's bytes are once llama.cpp offloads layers to a GPU: host and device memory apart.

:func:`split_by_device` turns a :class:`~runtime.llm.plan.MemoryPlan` and its GGUF header into a
:class:`~runtime.llm.plan.DeviceSplit` (runtime/llm/loader.py attaches it when the measured offload put layers on a GPU).
"""

from __future__ import annotations

import re

from runtime.formats.gguf_file import GGUFInfo
from runtime.llm.plan import VERIFY_ROWS, DeviceSplit, KVType, LLMShape, MemoryPlan

# llama.cpp (src/llama-model.cpp, load_tensors) with n_gpu_layers = k: the output layer counts as layer n_layer, and
# layers il >= n_layer + 1 - k go to the GPU (so k = 1 offloads only the output layer, k = n_layer + 1 everything);
# the input layer (token embedding) always stays on the CPU. With offload_kqv (edgerun's default) a layer's KV cache
# lives where the layer does. A tied embedding used as the output layer is copied to the output layer's device.
DEVICE_RUNTIME_OVERHEAD = 256 << 20  # CUDA context and cuBLAS workspace on the device: an estimate, not yet measured
# on a GPU (scripts/gpu-check.sh reports the GPU's memory in use beside this plan's device total, to fit it)
_BLOCK = re.compile(r"^blk\.(\d+)\.")
_OUTPUT = ("output.weight", "output.bias", "output_norm.weight", "output_norm.bias")


def _layer_of(name: str, n_layer: int) -> int | None:
    """The layer a tensor belongs to: 0..n_layer-1, n_layer for the output layer, None for the input layer."""
    found = _BLOCK.match(name)
    if found:
        return int(found[1])
    return n_layer if name in _OUTPUT else None


def _split_model(info: GGUFInfo, shape: LLMShape, k: int, kv: KVType, cells: int, swa_cells: int, compute: int,
                 logits: int, prefix: str, host: dict[str, int], device: dict[str, int]) -> None:
    """Add one model's weights, KV cache and compute to ``host``/``device`` for ``k`` layers on the device."""
    n_layer = shape.n_layer
    k = max(0, min(k, n_layer + 1))
    first = n_layer + 1 - k  # the first layer on the device (n_layer: only the output layer)
    names = {t.name for t in info.tensors}
    for t in info.tensors:
        il = _layer_of(t.name, n_layer)
        side = device if il is not None and il >= first else host
        side[f"{prefix}weights"] = side.get(f"{prefix}weights", 0) + t.nbytes
        if t.name == "token_embd.weight" and k >= 1 and "output.weight" not in names:
            device[f"{prefix}weights"] = device.get(f"{prefix}weights", 0) + t.nbytes  # the tied output's copy
    for il, (h, is_swa) in enumerate(zip(shape.n_head_kv, shape.swa_layers, strict=True)):
        side = device if il >= first else host
        n = swa_cells if is_swa else cells
        cell = h * (shape.key_length + shape.value_length) * kv.bytes_per_element
        side[f"{prefix}KV cache"] = side.get(f"{prefix}KV cache", 0) + int(cell * n)
    on_device = max(0, k - 1)  # repeating layers on the device
    activations = compute - logits
    if k >= 1:
        device[f"{prefix}compute"] = device.get(f"{prefix}compute", 0) + activations
    host[f"{prefix}compute"] = host.get(f"{prefix}compute", 0) + logits + (activations if on_device < n_layer else 0)


def split_by_device(plan: MemoryPlan, info: GGUFInfo, layers_on_device: int, *, unified: bool,
                    draft: GGUFInfo | None = None) -> DeviceSplit:
    """``plan`` (for ``info``; ``draft``: its draft model's header when it has one) with ``layers_on_device`` layers
    on a GPU, as host and device terms. The draft runs on the same placement, so the same count of its layers."""
    shape = LLMShape.from_gguf(info)
    host: dict[str, int] = {}
    device: dict[str, int] = {}
    logits = shape.logits_bytes(plan.n_slots * VERIFY_ROWS)  # the rows compute_bytes counts, read back to the host
    swa_cells = plan.swa.get("cells", 0) * plan.n_slots
    _split_model(info, shape, layers_on_device, plan.kv_type, plan.n_ctx, swa_cells, plan.compute_bytes, logits, "",
                 host, device)
    d = plan.draft
    if d is not None and draft is not None:
        dshape = LLMShape.from_gguf(draft)
        _split_model(draft, dshape, layers_on_device, d.kv_type, d.n_ctx, dshape.swa_cells(d.n_ctx, d.n_ubatch),
                     d.compute_bytes, dshape.logits_bytes(1), "draft ", host, device)
    elif d is not None:
        host["draft (not split: header not given)"] = d.weights_bytes + d.kv_bytes + d.compute_bytes
    if layers_on_device > 0:
        device["runtime (CUDA context, estimate)"] = DEVICE_RUNTIME_OVERHEAD
    host["prefix cache (bound)"] = plan.prefix_cache_bytes
    host["runtime (python + libs)"] = plan.runtime_bytes
    host["vocabulary tables"] = plan.vocab_bytes + (d.vocab_bytes if d is not None else 0)
    return DeviceSplit(layers_on_device=max(0, min(layers_on_device, shape.n_layer + 1)), n_layer=shape.n_layer,
                       unified=unified, host=host, device=device)
