"""The planner's slots: the KV budget split between sequences, as llama.cpp allocates it, and `edgerun plan --slots`."""

from __future__ import annotations

import re

import pytest

from apps.cli import main as cli
from devices.backends import BackendName
from devices.placement import cpu_placement
from runtime.backends.llamacpp_batch import LlamaCppBatch
from runtime.errors import BadInput
from runtime.formats.gguf_file import read_gguf
from runtime.llm.plan import CTX_PAD, MAX_SLOTS, VERIFY_ROWS, KVType, plan_llm

GiB = 1 << 30


def test_slots_split_the_kv_cache(smollm) -> None:
    info = read_gguf(smollm.path())
    one = plan_llm(info, GiB, ctx=512)
    four = plan_llm(info, GiB, ctx=512, slots=4)
    assert (one.n_slots, one.slot_ctx, one.n_ctx) == (1, 512, 512)
    assert (four.n_slots, four.slot_ctx, four.n_ctx) == (4, 512, 2048)
    assert four.kv_bytes == 4 * one.kv_bytes
    # Rows of logits per sequence decoded together: its next token's and one per draft token verified with it.
    assert four.compute_bytes - one.compute_bytes == 3 * VERIFY_ROWS * info.n_vocab * 4
    # Without --ctx the context one sequence would get is split between the slots.
    whole = plan_llm(info, GiB)
    split = plan_llm(info, GiB, slots=4)
    assert split.slot_ctx == whole.n_ctx // 4 // CTX_PAD * CTX_PAD and split.n_ctx == 4 * split.slot_ctx
    assert split.kv_bytes == whole.kv_bytes


def test_one_slot_is_the_single_stream_plan(smollm) -> None:
    info = read_gguf(smollm.path())
    plan = plan_llm(info, GiB)
    assert plan == plan_llm(info, GiB, slots=1)
    assert f"KV cache (f16, {plan.n_ctx} ctx)" in plan.table() and "slots:" not in plan.table()


def test_slots_are_bounded(smollm) -> None:
    info = read_gguf(smollm.path())
    for bad in (0, MAX_SLOTS + 1, True, 2.0):
        with pytest.raises(BadInput, match="--slots"):
            plan_llm(info, GiB, slots=bad)
    with pytest.raises(BadInput, match="smaller than --slots 8"):
        plan_llm(info, GiB, slots=8, n_ubatch=4)


@pytest.mark.parametrize("kv", [KVType.F16, KVType.Q8_0])
def test_planned_slots_match_what_llama_cpp_allocates(smollm, gemma, kv, capfd) -> None:
    # SmolLM2: 30 full-attention layers. Gemma 3: sliding-window layers, whose cells each slot holds on its own.
    for model, slots, ctx in ((smollm, 4, 512), (gemma, 3, 1024)):
        plan = plan_llm(read_gguf(model.path()), GiB, ctx=ctx, kv_type=kv, slots=slots)
        with model.opened(model.manifest.file("weights").path) as (path,):
            backend = LlamaCppBatch(path, plan, cpu_placement(BackendName.LLAMACPP, 1), native_log=True)
        try:
            assert (backend.n_slots, backend.slot_ctx) == (slots, ctx)
        finally:
            backend.close()
        err = capfd.readouterr().err
        native = int(sum(float(x) for x in re.findall(r"llama_kv_cache: size = +([\d.]+) MiB", err)) * (1 << 20))
        assert native and abs(plan.kv_bytes - native) <= 0.01 * native + (16 << 10), (model.manifest.ref, plan.kv_bytes, native)


def test_plan_command_shows_the_slots(smollm, capsys) -> None:
    assert cli(["plan", "default", "--memory", "1G", "--slots", "4", "--ctx", "1024"]) == 0
    out = capsys.readouterr().out
    assert "KV cache (f16, 4 x 1024 ctx)" in out and "slots: 4 sequences decoded together, each 1024 tokens" in out
    assert cli(["plan", "default", "--memory", "1G", "--slots", "4", "--json"]) == 0
    assert '"n_slots": 4' in capsys.readouterr().out
    assert cli(["plan", "default", "--slots", str(MAX_SLOTS + 1)]) == 2
    assert f"use an integer from 1 to {MAX_SLOTS}" in capsys.readouterr().err
