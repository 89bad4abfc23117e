"""Speculative decoding on the real models: greedy output token-identical with and without it (SmolLM2, the
default bundle, and Gemma 3 270M, whose sliding-window layers must drop draft cells too), on text that repeats
(rewrite, where drafts are accepted) and text that does not; EOS, a stop string and max_tokens inside an
accepted draft; the cache refusing to drop draft cells; the CLI's --no-speculate and --json stats."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence

import pytest

from runtime.llm.model import LLM
from runtime.llm.sampling import SamplingParams
from runtime.llm.speculative import Adaptive, PromptLookup, Speculator

pytestmark = pytest.mark.slow  # the real packaged models, end to end
GiB = 1 << 30

TEXT = ("The lighthouse keeper climbed the spiral stairs every evening at dusk. He trimmed the wick, polished the "
        "great lens and wound the clockwork that turned the light. Ships far out at sea watched for its slow white "
        "flash, counted the seconds between the beams and knew where the rocks lay. In winter the storms came in "
        "from the west and salt spray reached the lantern room, but the light never failed.")
GREEDY = SamplingParams(max_tokens=96, temperature=0.0)


class Always(Adaptive):
    """A controller that drafts ``k`` tokens every step: the verify path runs on every token."""

    def __init__(self, k: int) -> None:
        super().__init__(k_max=k)

    def plan(self, limit: int | None = None) -> int:
        return self.k_max if limit is None else min(self.k_max, limit)


class Recording(PromptLookup):
    def __init__(self) -> None:
        super().__init__()
        self.drafts: list[list[int]] = []

    def draft(self, context: Sequence[int], n: int) -> list[int]:
        out = super().draft(context, n)
        if out:
            self.drafts.append(out)
        return out


@pytest.fixture(scope="module")
def smol(smollm) -> Iterator[LLM]:
    with LLM.load(smollm, memory=GiB, ctx=2048, threads=2) as llm:
        yield llm


@pytest.fixture(scope="module")
def gemma3(gemma) -> Iterator[LLM]:
    with LLM.load(gemma, memory=GiB, ctx=2048, threads=2) as llm:
        yield llm


def both(llm: LLM, run, k: int = 4, drafter: PromptLookup | None = None, controller: Adaptive | None = None):
    """``run(llm)`` plainly, then with a draft of ``k`` verified at every step (or as ``controller`` plans); the two
    results."""
    keep = llm.speculator
    try:
        llm.speculator = None
        plain = run(llm)
        llm.speculator = Speculator(drafter or PromptLookup(), controller or Always(k))
        spec = run(llm)
    finally:
        llm.speculator = keep
    return plain, spec


def same(plain, spec) -> None:
    assert (spec.text, spec.tokens_out, spec.stop_reason) == (plain.text, plain.tokens_out, plain.stop_reason)


def chat(messages: list[dict[str, str]], params: SamplingParams = GREEDY):
    return lambda llm: llm.chat(messages, params).finish()


def test_smollm_rewrite_is_token_identical_and_drafts_are_accepted(smol) -> None:
    plain, spec = both(smol, chat([{"role": "user", "content": f"Rewrite this text word for word:\n\n{TEXT}"}]))
    same(plain, spec)
    assert spec.speculation["drafted"] > 0 and spec.speculation["accepted"] > 0, spec.speculation
    assert plain.speculation["enabled"] is False and spec.speculation["enabled"] is True


class Forced(Adaptive):
    """The adaptive controller, never switched off: its warm-up and probes time plain steps."""

    OFF_BELOW = -1.0


def test_speculation_accounts_for_its_drafting_and_what_its_verify_steps_saved(smol) -> None:
    plain, spec = both(smol, chat([{"role": "user", "content": f"Rewrite this text word for word:\n\n{TEXT}"}]),
                       controller=Forced())
    assert plain.speculation["draft_ms"] == 0 and plain.speculation["saved_ms"] == 0  # no speculator: nothing to count
    assert spec.speculation["draft_ms"] > 0  # a draft at every step
    # each verify step's tokens against the plain step's measured time: some time saved or lost, never untallied
    assert spec.speculation["steps"] > 0 and spec.speculation["saved_ms"] != 0


def test_smollm_text_that_does_not_repeat_is_token_identical(smol) -> None:
    plain, spec = both(smol, chat([{"role": "user", "content": "Name three colours and say why the sky is blue."}]), k=2)
    same(plain, spec)
    assert spec.speculation["drafted"] > 0  # verified at every step, accepted or not


def test_seeded_sampling_draws_as_plain_decoding_does(smol) -> None:
    """One sampler draw per emitted token, in plain decoding's order (the penalty history too): with the same
    seed the sampled text is the plain one (the logits of a verify batch equal the single-token ones here).

    A first run leaves the prompt in the cache, so that both measured runs start from the same cells: a prompt
    computed in one large batch gives logits a rounding apart from those of the cached prompt's last token, and
    a sampled (not greedy) answer can tell them apart."""
    params = SamplingParams(max_tokens=64, temperature=0.8, top_k=0, repeat_penalty=1.1, seed=1234)
    run = chat([{"role": "user", "content": f"Rewrite this text word for word:\n\n{TEXT}"}], params)
    both(smol, run)
    plain, spec = both(smol, run)
    same(plain, spec)
    assert spec.speculation["accepted"] > 0


def test_gemma_sliding_window_drops_draft_cells_and_stays_token_identical(gemma3) -> None:
    """A prompt longer than the sliding-window cache (window + micro-batch cells): draft cells are written
    over cells the window no longer needs and removed again, and the output stays the plain one."""
    long_text = " ".join([TEXT] * 14)
    prompt = f"{long_text}\n\nThe same story, told again:\n{TEXT[:120]}"
    params = SamplingParams(max_tokens=80, temperature=0.0)
    plain, spec = both(gemma3, lambda llm: llm.generate(prompt, params))
    assert plain.tokens_in > 1100
    same(plain, spec)
    assert spec.speculation["accepted"] > 0, spec.speculation


def test_past_512_cells_on_two_threads_a_q8_0_cache_keeps_greedy_output_token_identical(smollm) -> None:
    """Two threads and a context past 512 cells, where llama.cpp's single-token flash attention over an f16 cache
    splits the cells between the threads and a verify batch does not (with f16 the summary below differs within
    200 tokens): with ``kv_type="q8_0"`` every step of SmolLM2 computes its logits one way (docs/benchmarks.md)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "converters" / "data" / "eval.txt").read_text(encoding="utf-8")[:2600]
    run = chat([{"role": "user", "content": f"Summarize this text:\n\n{text}"}], SamplingParams(max_tokens=200, temperature=0.0))
    with LLM.load(smollm, memory=GiB, ctx=2048, threads=2, kv_type="q8_0") as llm:
        plain, spec = both(llm, run)
        assert len(llm.kv.tokens) > 700  # the prompt and the answer: past 512 cells
    same(plain, spec)
    assert spec.speculation["accepted"] > 0


def test_drafts_are_capped_where_a_verify_batch_computes_other_logits_than_single_steps(gemma) -> None:
    """Gemma 3's Q4_K_M: on this x86 CPU llama.cpp multiplies 4 or more rows with other kernels than one row, and
    the logits differ (up to 1.0); with drafts of 8 verified at every step, greedy text over eval.txt differed from
    plain decoding in 6 of 6 excerpts. The load measures the longest exact batch and caps every draft at it.

    Each run starts from an empty cache (no prefix cache): a prompt resumed from cells computed in one prefill
    re-decodes its last token alone, which on this model is itself a rounding apart from the prefill's row."""
    from pathlib import Path

    from runtime.llm.speculative import K_MAX

    text = (Path(__file__).resolve().parents[2] / "converters" / "data" / "eval.txt").read_text(encoding="utf-8")
    params = SamplingParams(max_tokens=160, temperature=0.0)
    with LLM.load(gemma, memory=GiB, ctx=2048, threads=2, prefix_cache_bytes=0) as llm:
        assert 1 <= llm.max_draft < K_MAX  # measured here: batches of 4+ rows differ
        assert llm.max_draft == llm.backend.exact_batch(K_MAX + 1) - 1  # the measure, again: the same
        assert llm.speculator is not None and llm.speculator.controller.k_max == llm.max_draft
        for excerpt in (text[:400], text[800:1200]):
            def run(model: LLM, e: str = excerpt):
                model.kv.clear()
                return model.generate(e, params)

            plain, spec = both(llm, run, k=K_MAX)  # asks for drafts of 8: capped
            same(plain, spec)
            assert spec.speculation["accepted"] > 0
            assert spec.speculation["drafted"] <= spec.speculation["steps"] * llm.max_draft


def test_the_exact_batch_probe_leaves_the_cache_empty_and_smollm_verifies_every_draft_length(smol) -> None:
    from runtime.backends.llamacpp import llama_cpp
    from runtime.llm.speculative import K_MAX

    try:
        smol.backend.decode(smol.tokenize("some context"), 0)
        assert smol.backend.exact_batch(K_MAX + 1) == K_MAX + 1  # Q4_1's rows agree at every batch size here
        assert llama_cpp.llama_memory_seq_pos_max(smol.backend._mem, 0) == -1  # no cell left behind
    finally:
        smol.kv.clear()  # the LLM's own record of the cells, emptied with them
    assert smol.max_draft == K_MAX and smol.speculator.controller.k_max == K_MAX


def test_gemma_text_that_does_not_repeat_is_token_identical(gemma3) -> None:
    params = SamplingParams(max_tokens=48, temperature=0.0)
    plain, spec = both(gemma3, lambda llm: llm.generate("A recipe for bread: first,", params), k=3)
    same(plain, spec)
    assert spec.speculation["drafted"] > 0


def test_eos_inside_an_accepted_draft_ends_as_plain_decoding_does(smol) -> None:
    """The chat prompt holds the sentence followed by the end-of-turn token: repeating it, the draft carries
    that EOS, and the target accepts it."""
    sentence = "The cat sat on the warm mat by the door."
    drafter = Recording()
    plain, spec = both(smol, chat([{"role": "user", "content": f"Repeat exactly: {sentence}"}]), k=8, drafter=drafter)
    same(plain, spec)
    assert spec.stop_reason == "eos"
    assert any(smol.backend.is_eog(t) for d in drafter.drafts for t in d)


def test_max_tokens_and_a_stop_string_inside_a_draft(smol) -> None:
    messages = [{"role": "user", "content": f"Rewrite this text word for word:\n\n{TEXT}"}]
    for params in (GREEDY.with_(max_tokens=37), GREEDY.with_(stop=("polished",))):
        plain, spec = both(smol, chat(messages, params), k=8)
        same(plain, spec)
        assert spec.speculation["accepted"] > 0
    assert spec.stop_reason == "stop" and "polished" not in spec.text
    # the cells of draft tokens left unverified were dropped: the cache holds the prompt and emitted tokens only
    # (the last one too when it was an accepted draft token), and the next generation (reusing it) is the plain one
    assert smol.backend._llm.n_tokens == len(smol.kv.tokens) <= spec.tokens_in + spec.tokens_out
    again, _ = both(smol, chat(messages))
    fresh, _ = both(smol, chat(messages))
    same(again, fresh)


def test_context_shifts_happen_where_plain_decoding_has_them(smollm) -> None:
    """Drafts never run past the context: it shifts at the same tokens, dropping as many, and the text stays."""
    with LLM.load(smollm, memory=GiB, ctx=256, threads=2) as small:
        params = SamplingParams(max_tokens=300, temperature=0.0)
        plain, spec = both(small, lambda llm: llm.generate("Count: 1, 2, 3, 4, 5,", params), k=8)
    same(plain, spec)
    assert spec.truncations == plain.truncations and len(plain.truncations) >= 1
    assert spec.speculation["accepted"] > 0


class Until(Always):
    """:class:`Always`, until the backend refuses to drop draft cells: then, as :class:`Adaptive`, never again."""

    def plan(self, limit: int | None = None) -> int:
        return 0 if self.disabled else super().plan(limit)


class Oracle:
    """A drafter that knows plain decoding's tokens (``answer``: the prompt and the greedy answer): its one draft
    is the next ``n - 1`` tokens the target emits, then one it does not emit, so the first verify step accepts
    ``n - 1`` and must drop the last cell, whatever the CPU's kernels, the step timings or the text."""

    name = "oracle"
    cheap = False

    def __init__(self, answer: Sequence[int]) -> None:
        self.answer = list(answer)
        self.drafts: list[list[int]] = []

    def draft(self, context: Sequence[int], n: int) -> list[int]:
        at = len(context)
        if self.drafts or at + n > len(self.answer):  # one draft; the next n tokens must be known
            return []
        assert list(context) == self.answer[:at]  # so far, plain decoding's tokens
        miss = self.answer[at + n - 1]
        out = [*self.answer[at : at + n - 1], miss - 1 if miss else 1]
        self.drafts.append(out)
        return out

    def accepted(self, context: Sequence[int], n_drafted: int, n_accepted: int) -> None:
        pass


def test_a_cache_that_refuses_to_drop_draft_cells_is_recomputed_and_speculation_stops(smol, monkeypatch, caplog) -> None:
    """The draft is forced to end in a rejected token (an oracle drafter): the cache refuses to drop its cell, the
    kept tokens are recomputed and speculation is disabled for good.

    It used to draft by prompt lookup under the adaptive controller, and so depended on the CPU: the refusal needs a
    rejected draft while speculation is on. On an AVX-512 VNNI CPU the greedy text's first lookup draft (at step 10)
    is rejected and disables speculation; on an AVX2 EPYC (other kernels, other rounding, maybe other text) it never
    was: a draft accepted first teaches the controller the verify batch's cost, and where that batch costs nearly a
    plain step per token it switches itself off before any draft is rejected. The recomputed cells come from one
    batch and round differently from cells computed token by
    token: only the tokens up to the refusal must be plain decoding's (as in test_engine_speculative)."""
    import llama_cpp

    remove = smol.backend.remove
    monkeypatch.setattr(smol.backend, "remove", lambda start, end=-1: False if end < 0 and start > 0 else remove(start, end))
    messages = [{"role": "user", "content": "Count from one to twenty in words, separated by commas."}]
    keep = smol.speculator
    ctl = Until(4)
    assert smol.max_draft >= 1, smol.max_draft  # SmolLM2 verifies drafts (test_the_exact_batch_probe... above)
    try:
        smol.speculator = None
        plain = smol.chat(messages, GREEDY).finish()
        answer = list(smol.kv.tokens)  # the prompt and the answer (the last token sampled never goes in)
        oracle = Oracle(answer)
        smol.speculator = Speculator(oracle, ctl)
        caplog.set_level("WARNING")
        spec = smol.chat(messages, GREEDY).finish()
        cells = llama_cpp.llama_memory_seq_pos_max(smol.backend._mem, 0) + 1
    finally:
        smol.speculator = keep
    k = min(4, smol.max_draft)
    assert plain.tokens_out > k + 2  # room for the draft and the target's own token after it
    assert oracle.drafts and len(oracle.drafts[0]) == k  # drafted once, at the first step
    stats = spec.speculation
    assert (stats["steps"], stats["drafted"], stats["accepted"]) == (1, k, k - 1)  # one verify step, none after it
    assert ctl.disabled and stats["on"] is False
    assert "the KV cache refused to drop 1 draft cells" in caplog.text and "speculation disabled" in caplog.text
    # what holds exactly: the first token, the k - 1 accepted ones and the target's own after them are plain's
    exact = plain.tokens_in + 1 + k
    assert smol.kv.tokens[:exact] == answer[:exact]
    assert cells == len(smol.kv.tokens) > exact  # the recomputed cache holds what was emitted, and nothing else


def test_default_speculation_is_on_and_reports_itself(smol) -> None:
    result = smol.chat([{"role": "user", "content": f"Rewrite this text word for word:\n\n{TEXT}"}], GREEDY).finish()
    stats = result.speculation
    assert stats["drafter"] == "prompt-lookup" and stats["enabled"] is True
    assert set(stats) >= {"on", "steps", "drafted", "accepted", "acceptance", "mean_draft"}
    plain = smol.start("Hello", GREEDY.with_(max_tokens=4), speculate=False).finish()
    assert plain.speculation["enabled"] is False and plain.speculation["drafted"] == 0


def test_cli_no_speculate_and_json_stats(smollm, capsys) -> None:
    from apps.cli import main as cli

    args = ["run", "default", "--prompt", "one two three one two three one two", "--max-tokens", "8",
            "--temperature", "0", "--memory", "1G", "--threads", "2", "--ctx", "512", "--json"]
    assert cli(args) == 0
    on = json.loads(capsys.readouterr().out)
    assert cli([*args, "--no-speculate"]) == 0
    off = json.loads(capsys.readouterr().out)
    assert on["speculation"]["enabled"] is True and off["speculation"]["enabled"] is False
    assert on["text"] == off["text"]
    assert cli([*args, "--no-speculate", "--draft", str(smollm.path())]) == 2
    err = capsys.readouterr().err
    assert "--no-speculate" in err and err.count("\n") == 1
