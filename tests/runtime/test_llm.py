"""The real packaged models, end to end: plan, load, generate, stream, shift, reuse."""

from __future__ import annotations

import json
import re

import pytest

from devices.placement import cpu_placement
from runtime.backends.llamacpp import LlamaCppBackend
from runtime.errors import BadInput
from runtime.formats.gguf_file import read_gguf
from runtime.llm.model import LLM
from runtime.llm.plan import KVType, plan_llm
from runtime.llm.sampling import SamplingParams

GiB = 1 << 30


@pytest.fixture(scope="module")
def llm(smollm):
    with LLM.load(smollm, memory=GiB, ctx=2048, threads=2) as model:
        yield model


def _native_kv_bytes(capsys, path, plan) -> int:
    """Sum of the KV buffers llama.cpp itself reports while loading."""
    with LlamaCppBackend(path, plan, cpu_placement("llamacpp"), native_log=True):
        pass
    err = capsys.readouterr().err
    sizes = [float(x) for x in re.findall(r"llama_kv_cache: size = +([\d.]+) MiB", err)]
    assert sizes, err[-2000:]
    return int(sum(sizes) * (1 << 20))


@pytest.mark.parametrize("kv", [KVType.F16, KVType.Q8_0])
def test_planned_kv_cache_matches_llama_cpp(smollm, gemma, kv, capsys) -> None:
    # SmolLM2: 30 full-attention layers. Gemma 3: 15 sliding-window + 3 global layers.
    for model, ctx in ((smollm, 2048), (gemma, 4096)):
        plan = plan_llm(read_gguf(model.path()), GiB, ctx=ctx, kv_type=kv)
        native = _native_kv_bytes(capsys, model.path(), plan)
        assert abs(plan.kv_bytes - native) <= 0.01 * native + (16 << 10), (model.manifest.ref, plan.kv_bytes, native)


def test_gemma_sliding_window_is_planned_as_such(gemma) -> None:
    plan = plan_llm(read_gguf(gemma.path()), GiB, ctx=8192, kv_type=KVType.F16)
    assert plan.swa == {"layers": 15, "window": 512, "cells": 1024}
    # Global layers: 3 x 1 KV head x (256 + 256) x 2 bytes per cell; SWA layers a fixed 1024 cells.
    assert plan.kv_bytes_per_token == 3 * 512 * 2
    assert plan.kv_bytes == 3 * 512 * 2 * 8192 + 15 * 512 * 2 * 1024


def test_greedy_is_reproducible_and_streams(llm) -> None:
    params = llm.params(temperature=0.0, max_tokens=24)
    gen = llm.stream("The three primary colors are", params)
    pieces = list(gen)
    result = gen.result
    assert len(pieces) > 3 and "".join(pieces) == result.text
    assert result.tokens_out == 24 and result.stop_reason == "length"
    llm.kv.clear()
    again = llm.generate("The three primary colors are", params)
    assert again.text == result.text


def test_same_seed_same_text(llm) -> None:
    params = llm.params(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, max_tokens=24, seed=1234)
    first = llm.generate("Once upon a time", params)
    second = llm.generate("Once upon a time", params)
    other = [llm.generate("Once upon a time", params.with_(seed=s)).text for s in (1, 2, 3)]
    assert first.text == second.text
    assert any(t != first.text for t in other)  # the seed is actually used


def test_unseeded_sampling_draws_a_fresh_seed_that_reproduces_the_run(llm) -> None:
    params = SamplingParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, max_tokens=24)
    assert params.seed is None
    first = llm.generate("Once upon a time", params)
    second = llm.generate("Once upon a time", params)
    assert first.seed != second.seed and first.text != second.text  # not the same answer every time
    again = llm.generate("Once upon a time", params.with_(seed=first.seed))
    assert (again.seed, again.text) == (first.seed, first.text)


def test_run_json_reports_the_seed_that_reproduces_it(smollm, capsys) -> None:
    from apps.cli import main as cli

    args = ["run", "default", "--prompt", "Once upon a time", "--max-tokens", "16", "--temperature", "0.9", "--top-k", "0",
            "--memory", "1G", "--ctx", "512", "--threads", "2", "--json"]
    assert cli(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert isinstance(first["seed"], int)
    assert cli([*args, "--seed", str(first["seed"])]) == 0
    again = json.loads(capsys.readouterr().out)
    assert (again["seed"], again["text"]) == (first["seed"], first["text"])


def spy_on_close(monkeypatch) -> list[bool]:
    """Each LlamaCppBackend.close from now on appends whether a loaded llama.cpp model was there to free."""
    closed: list[bool] = []
    real_close = LlamaCppBackend.close

    def spy(self) -> None:
        closed.append(self._llm is not None)
        real_close(self)

    monkeypatch.setattr(LlamaCppBackend, "close", spy)
    return closed


def test_a_failure_after_llama_cpp_loaded_closes_it(smollm, monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise BadInput("injected after the backend loaded")

    closed = spy_on_close(monkeypatch)
    monkeypatch.setattr(SamplingParams, "from_defaults", broken)
    with pytest.raises(BadInput, match="injected"):
        LLM.load(smollm, memory=GiB, ctx=256, threads=1)
    assert closed == [True]  # the loaded llama.cpp model was freed, once


def test_a_failure_of_the_exact_batch_probe_closes_the_loaded_model(smollm, monkeypatch) -> None:
    from runtime.errors import BackendError

    def broken(self, limit: int) -> int:
        raise BackendError("injected: the probe's decode failed")

    closed = spy_on_close(monkeypatch)
    monkeypatch.setattr(LlamaCppBackend, "exact_batch", broken)
    with pytest.raises(BackendError, match="injected"):
        LLM.load(smollm, memory=GiB, ctx=256, threads=1)
    assert closed == [True]
    with LLM.load(smollm, memory=GiB, ctx=256, threads=1, speculate=False) as llm:  # no drafts: no probe at all
        assert llm.speculator is None


def test_context_shift_keeps_going_past_the_context(smollm) -> None:
    with LLM.load(smollm, memory=GiB, ctx=256, threads=2) as small:
        params = small.params(temperature=0.0, max_tokens=600, repeat_penalty=1.0)
        gen = small.stream("Count: 1, 2, 3, 4, 5,", params)
        longest = 0
        for _ in gen:
            longest = max(longest, len(small.kv.tokens))
        result = gen.result
        assert result.tokens_out == 600  # ran to the end instead of failing at 256
        assert longest <= small.n_ctx == 256
        assert result.truncated and {t.kind for t in result.truncations} == {"shift"}
        assert sum(t.tokens_dropped for t in result.truncations) >= 600 - 256
        assert re.search(r"\d+, \d+", result.text[-60:])  # still counting coherently


def test_long_prompt_is_truncated_and_reported(smollm) -> None:
    with LLM.load(smollm, memory=GiB, ctx=256, threads=2) as small:
        prompt = "word " * 600
        result = small.generate(prompt, small.params(max_tokens=8, temperature=0.0))
        assert result.truncations[0].kind == "prompt"
        assert result.truncations[0].tokens_dropped >= 600 - 256
        assert result.tokens_in >= 600


def test_prefix_cache_restores_a_shared_prefix(llm) -> None:
    system = "You answer questions about the following manual. " + " ".join(f"Rule {i}: keep part {i} clean." for i in range(60))
    params = llm.params(temperature=0.0, max_tokens=4)
    llm.kv.clear()
    hits0 = llm.prefix_cache.hits
    cold = llm.generate(system + " Question: what is rule 3?", params)
    llm.generate("Something unrelated about the weather today and tomorrow.", params)  # evicts the live KV
    warm = llm.generate(system + " Question: what is rule 7?", params)
    assert cold.reused_tokens == 0
    assert warm.prefix_cache_hit and warm.reuse_source == "saved"
    assert warm.reused_tokens >= len(llm.tokenize(system)) - 2
    assert llm.prefix_cache.hits > hits0
    assert warm.ttft_ms < cold.ttft_ms / 3


def test_chat_drops_oldest_turns_and_reuses_the_rest(smollm) -> None:
    from runtime.llm.chat import ChatSession

    with LLM.load(smollm, memory=GiB, ctx=512, threads=2) as small:
        session = ChatSession(small, "You are a terse assistant.", small.params(temperature=0.0, max_tokens=24))
        kinds, sources = [], []
        for i in range(14):
            result = session.send(f"Fact {i}: the parcel number {i} goes to shelf {i * 7}. " * 3 + "Reply OK.").finish()
            kinds += [t.kind for t in result.truncations]
            sources.append(result.reuse_source)
            assert len(small.kv.tokens) <= 512
        assert "turns" in kinds
        assert "kv+shift" in sources  # turns after the dropped ones were shifted, not recomputed
        assert session.messages[0]["role"] == "system"


def test_base_model_has_no_chat(gemma) -> None:
    with LLM.load(gemma, memory=GiB, ctx=1024, threads=2) as base:
        result = base.generate("The Eiffel Tower is a wrought-iron tower in the city of", base.params(temperature=0.0, max_tokens=6))
        assert "Paris" in result.text, result.text
        with pytest.raises(BadInput, match="no chat template"):
            base.chat([{"role": "user", "content": "hi"}])


def test_bad_sampling_values_are_refused(llm) -> None:
    for bad in (dict(temperature=-1), dict(top_p=0), dict(max_tokens=0), dict(min_p=1.5), dict(stop=("",))):
        with pytest.raises(BadInput):
            llm.params(**bad)


def test_stop_strings_end_generation(llm) -> None:
    result = llm.generate("Count: 1, 2, 3, 4,", llm.params(temperature=0.0, max_tokens=40, stop=("8",)))
    assert result.stop_reason == "stop" and "8" not in result.text and "7" in result.text


@pytest.mark.parametrize("which", ["smollm", "gemma"])
def test_greedy_text_equals_raw_llama_cpp(which, request) -> None:
    """Same GGUF, same settings: edgerun's loop and llama-cpp-python's own generate agree token for token."""
    from llama_cpp import Llama

    model = request.getfixturevalue(which)
    prompt = "Small computers on a factory line"
    with LLM.load(model, memory=GiB, ctx=1024, kv_type="f16", threads=2) as ours:
        mine = ours.generate(prompt, ours.params(temperature=0.0, max_tokens=32, repeat_penalty=1.0)).text
    raw = Llama(str(model.path()), n_ctx=1024, n_threads=2, flash_attn=True, swa_full=False, verbose=False)
    try:
        out = raw.create_completion(prompt, max_tokens=32, temperature=0.0, repeat_penalty=1.0)
    finally:
        raw.close()
    assert mine == out["choices"][0]["text"]
