"""The planner's host and device memory once llama.cpp offloads layers (runtime.llm.plan_device.split_by_device).

llama.cpp puts layers il >= n_layer + 1 - k on the GPU for n_gpu_layers = k (the output layer is layer n_layer), keeps
the token embedding on the CPU, keeps each layer's KV cache with the layer, and copies a tied embedding to the output
layer's device. A discrete GPU (the x86-server fixture: /dev/nvidia0) holds its share apart from RAM; a Jetson (the
jetson-orin-nano fixture: /etc/nv_tegra_release, /dev/nvhost-gpu) allocates it from the same RAM, each weight once.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from devices.gpu_memory import unified_memory
from devices.machine import detect
from runtime.formats.gguf_file import read_gguf
from runtime.llm.plan import plan_llm
from runtime.llm.plan_device import DEVICE_RUNTIME_OVERHEAD, split_by_device
from tests.devices.conftest import FIXTURES
from tests.ggufgen import write_tiny

N_LAYER, N_EMBD, VOCAB = 4, 64, 32


def _with_output(w) -> None:  # an untied output layer, as most models have
    rng = np.random.default_rng(1)
    w.add_tensor("output_norm.weight", rng.standard_normal(N_EMBD, dtype=np.float32))
    w.add_tensor("output.weight", rng.standard_normal((VOCAB, N_EMBD), dtype=np.float32))


@pytest.fixture
def untied(tmp_path: Path):
    return read_gguf(write_tiny(tmp_path / "untied.gguf", n_layer=N_LAYER, n_embd=N_EMBD, vocab=VOCAB, kv_tensors=True,
                                edit=_with_output))


def _bytes(info, pred) -> int:
    return sum(t.nbytes for t in info.tensors if pred(t.name))


def _layer(name: str) -> int | None:
    return int(name.split(".")[1]) if name.startswith("blk.") else None


def test_the_fixtures_tell_a_jetson_from_a_discrete_gpu() -> None:
    assert unified_memory(detect(os.path.join(FIXTURES, "jetson-orin-nano")))
    assert not unified_memory(detect(os.path.join(FIXTURES, "x86-server")))


def test_discrete_gpu_holds_the_offloaded_layers_and_their_kv_apart_from_ram(untied) -> None:
    plan = plan_llm(untied, 1 << 30, ctx=512)
    unified = unified_memory(detect(os.path.join(FIXTURES, "x86-server")))
    every = split_by_device(plan, untied, 999, unified=unified)
    embd = _bytes(untied, lambda n: n == "token_embd.weight")
    # Everything but the input layer on the device; RAM keeps the embedding, the logits and the host-only terms.
    assert every.device["weights"] == untied.tensor_bytes - embd and every.host["weights"] == embd
    assert every.device["KV cache"] == plan.kv_bytes and "KV cache" not in every.host
    assert every.device["runtime (CUDA context, estimate)"] == DEVICE_RUNTIME_OVERHEAD
    assert every.ram_bytes == every.host_bytes < plan.total_bytes  # the device's share is not RAM
    assert every.layers_on_device == N_LAYER + 1

    # k = 3: the output layer and the last two repeating layers (llama.cpp's i_gpu_start = n_layer + 1 - k)
    part = split_by_device(plan, untied, 3, unified=unified)
    on_gpu = {2, 3}
    assert part.device["weights"] == _bytes(untied, lambda n: _layer(n) in on_gpu or n.startswith("output"))
    assert part.host["weights"] == _bytes(untied, lambda n: _layer(n) in {0, 1} or n == "token_embd.weight")
    assert part.device["KV cache"] == part.host["KV cache"] == plan.kv_bytes // 2  # equal heads in every layer
    assert part.host["compute"] > every.host["compute"]  # CPU layers need their activations in RAM

    # k = 1: only the output layer; k = 0: nothing on the device
    assert split_by_device(plan, untied, 1, unified=unified).device["weights"] == _bytes(untied, lambda n: n.startswith("output"))
    none = split_by_device(plan, untied, 0, unified=unified)
    assert none.device == {} and none.host["weights"] == untied.tensor_bytes and none.host["KV cache"] == plan.kv_bytes


def test_jetson_unified_memory_counts_each_weight_once(untied) -> None:
    plan = plan_llm(untied, 1 << 30, ctx=512)
    unified = unified_memory(detect(os.path.join(FIXTURES, "jetson-orin-nano")))
    split = split_by_device(plan, untied, 999, unified=unified)
    assert split.unified
    # The weights in RAM are the file's, once: the offloaded ones left the mapping for the GPU's allocation.
    assert split.host["weights"] + split.device["weights"] == untied.tensor_bytes
    assert split.ram_bytes == split.host_bytes + split.device_bytes
    # The plan's RAM total counts every weight once too; on top, only the device's own context and compute buffer.
    extra = split.ram_bytes - plan.total_bytes
    assert extra == DEVICE_RUNTIME_OVERHEAD + split.device["compute"] + split.host["compute"] - plan.compute_bytes
    assert "on the GPU: 5/5 layers" in plan.with_device(split).table()
    assert plan.with_device(split).to_dict()["device"]["ram_bytes"] == split.ram_bytes


def test_a_tied_embedding_is_copied_to_the_output_layers_device(tmp_path: Path) -> None:
    tied = read_gguf(write_tiny(tmp_path / "tied.gguf", n_layer=N_LAYER, n_embd=N_EMBD, vocab=VOCAB))
    plan = plan_llm(tied, 1 << 30, ctx=512)
    embd = _bytes(tied, lambda n: n == "token_embd.weight")
    split = split_by_device(plan, tied, 999, unified=True)
    assert split.host["weights"] == embd  # the input layer stays on the CPU
    assert split.device["weights"] == tied.tensor_bytes - embd + embd  # the repeating layers, and the output's copy


def test_sliding_window_layers_keep_their_own_kv_size_on_either_side(tmp_path: Path) -> None:
    # Gemma 3: 5 of every 6 layers hold only the window's cells; the split must add up to the plan's KV either way.
    info = read_gguf(write_tiny(tmp_path / "swa.gguf", arch="gemma3", n_layer=6, n_embd=N_EMBD, vocab=VOCAB, swa=64))
    plan = plan_llm(info, 1 << 30, ctx=2048)
    assert plan.swa and plan.kv_swa_bytes
    for k in range(0, 8):
        split = split_by_device(plan, info, k, unified=False)
        assert split.host.get("KV cache", 0) + split.device.get("KV cache", 0) == plan.kv_bytes
    last = split_by_device(plan, info, 2, unified=False)  # the output layer and layer 5 (global: n_ctx cells)
    assert last.device["KV cache"] == int(plan.kv_bytes_per_token * plan.n_ctx)


def test_a_load_whose_backend_put_layers_on_a_gpu_carries_the_split(tmp_path: Path) -> None:
    """open_llm splits the plan by the offload the backend measured (here a fake that reports the output layer and
    the last two layers on CUDA0), so `edgerun run --json` shows host and device apart."""
    from runtime.backends.base import Offload
    from runtime.llm.loader import open_llm
    from tests.runtime.fake_backend import FakeBackend

    path = write_tiny(tmp_path / "untied.gguf", n_layer=N_LAYER, n_embd=N_EMBD, vocab=VOCAB, kv_tensors=True,
                      edit=_with_output)

    class OnGpu(FakeBackend):
        def offload(self) -> Offload:
            return Offload("layers", 3, N_LAYER + 1, by_device=(("CPU", 2), ("CUDA0", 3)))

    opened = open_llm(str(path), memory="1G", ctx=256, kv_type=None, threads=1, target="cpu",
                      require_accelerator=False, prefix_cache_bytes=None, backend=lambda *_: OnGpu())
    split = opened.plan.device
    assert split is not None and split.layers_on_device == 3 and not split.unified  # this machine: no Jetson
    info = read_gguf(path)
    assert split.device["weights"] == _bytes(info, lambda n: _layer(n) in {2, 3} or n.startswith("output"))
    assert opened.plan.to_dict()["device"]["device_bytes"] == split.device_bytes
