"""Speculative decoding per slot in the continuous-batching engine, on the real default model: each decoding
slot's row carries its next token and a prompt-lookup draft, verified after the step's one llama_decode with the
slot's own sampler. Greedy text must be what plain decoding gives, token for token, with several requests
decoding together; the rejected drafts' cells must be gone from each sequence."""

from __future__ import annotations

import llama_cpp
import pytest

from runtime.serving.engine import Engine, GenRequest
from runtime.serving.engine_spec import StepCost
from runtime.serving.scheduler import Priority

GiB = 1 << 30
TEXT = ("The committee met on Tuesday to review the budget for the new library. The budget for the new library was "
        "approved after a long discussion about the cost of books, the cost of staff and the cost of heating.")
CHATS = [f"Repeat this text exactly: {TEXT}", f"Rewrite this text in plain words: {TEXT}",
         "Write the numbers from 1 to 30, separated by commas.", "Tell me about the sea."]


@pytest.fixture(scope="module")
def engine(smollm):
    with Engine.load(smollm, memory=GiB, slots=4, ctx=512, threads=2) as eng:
        yield eng


@pytest.fixture(scope="module")
def manual(smollm):
    """Two slots, no thread: the test drives each step."""
    with Engine.load(smollm, memory=GiB, slots=2, ctx=512, threads=2, start=False) as eng:
        yield eng


def _chat(eng: Engine, text: str, max_tokens: int, *, speculate: bool = True, priority: Priority = Priority.INTERACTIVE,
          **params) -> GenRequest:
    return eng.chat_request([{"role": "user", "content": text}],
                            eng.params(temperature=0.0, max_tokens=max_tokens, **params), speculate=speculate,
                            priority=priority)


def _run(eng: Engine, reqs: list[GenRequest]) -> list:
    handles = [eng.submit(r) for r in reqs]
    return [h.result(timeout=600) for h in handles]


def _drain(eng: Engine) -> None:
    while eng.step():
        pass


def _cells_hold_kv_tokens(eng: Engine) -> None:
    """Each sequence's cells are exactly what its slot says (no rejected draft token left behind)."""
    backend = eng.backend
    for slot in eng._loop.slots:
        top = llama_cpp.llama_memory_seq_pos_max(backend._mem, slot.id)
        assert top + 1 == len(slot.kv.tokens), (slot.id, top, len(slot.kv.tokens))


def test_greedy_text_is_token_identical_with_and_without_speculation_across_slots(engine) -> None:
    plain = _run(engine, [_chat(engine, c, 48, speculate=False) for c in CHATS])
    before = engine.stats()
    spec = _run(engine, [_chat(engine, c, 48) for c in CHATS])
    after = engine.stats()
    for chat, p, s in zip(CHATS, plain, spec, strict=True):
        assert s.text == p.text and s.tokens_out == p.tokens_out and s.stop_reason == p.stop_reason, chat
        assert not p.speculation["enabled"] and p.speculation["drafted"] == 0  # this request did not speculate
        assert s.speculation["enabled"] and s.speculation["drafter"] == "prompt-lookup"
    copy = spec[0].speculation
    assert copy["accepted"] > 0 and copy["drafted"] >= copy["accepted"], copy  # the copied text was drafted
    assert copy["draft_ms"] > 0 and p.speculation["draft_ms"] == 0  # what drafting took, per controller
    assert after["spec_drafted"] - before["spec_drafted"] == sum(s.speculation["drafted"] for s in spec)
    assert after["spec_accepted"] - before["spec_accepted"] == sum(s.speculation["accepted"] for s in spec)
    # Accepted drafts are several tokens per step for a slot: fewer steps than plain decoding needed.
    assert after["tokens_decoded"] - before["tokens_decoded"] == sum(s.tokens_out + (s.stop_reason == "eos") for s in spec)
    _cells_hold_kv_tokens(engine)


@pytest.mark.parametrize("max_tokens", [3, 7, 20])
def test_max_tokens_ends_inside_a_verify_step_as_in_plain_decoding(engine, max_tokens: int) -> None:
    plain, spec = _run(engine, [_chat(engine, CHATS[0], max_tokens, speculate=False), _chat(engine, CHATS[0], max_tokens)])
    assert spec.text == plain.text and spec.tokens_out == plain.tokens_out == max_tokens
    assert spec.stop_reason == plain.stop_reason == "length"
    _cells_hold_kv_tokens(engine)


def test_stop_string_and_eos_inside_accepted_drafts(engine) -> None:
    whole = _run(engine, [_chat(engine, CHATS[0], 120, speculate=False)])[0]
    assert whole.stop_reason == "eos"  # the copy ends by itself: EOS comes after drafted text
    stop = "approved after"
    assert stop in whole.text
    plain, spec, eos = _run(engine, [_chat(engine, CHATS[0], 120, speculate=False, stop=[stop]),
                                     _chat(engine, CHATS[0], 120, stop=[stop]), _chat(engine, CHATS[0], 120)])
    assert spec.text == plain.text == whole.text[: whole.text.index(stop)] and spec.stop_reason == "stop"
    assert spec.speculation["accepted"] > 0
    assert eos.text == whole.text and eos.stop_reason == "eos" and eos.tokens_out == whole.tokens_out
    assert eos.speculation["accepted"] > 0
    _cells_hold_kv_tokens(engine)


def test_drafts_take_only_the_room_left_after_next_tokens_and_prompt_chunks(manual) -> None:
    eng = manual
    loop, backend = eng._loop, eng.backend
    n_batch, chunk = backend.n_batch, loop.prefill_chunk
    steps: list[list] = []
    decode = backend.decode

    def recording(rows):
        steps.append([(r.seq, len(r.tokens), r.logits_all) for r in rows])
        return decode(rows)

    # A small batch, so that a prompt's chunk and the drafts compete for room (the native batch stays larger).
    backend.n_batch, loop.prefill_chunk = 24, 16
    backend.decode = recording
    try:
        spec = _run_manual(eng, [_chat(eng, CHATS[0], 40), _chat(eng, CHATS[1], 40)], stagger=6)
    finally:
        backend.n_batch, loop.prefill_chunk = n_batch, chunk
        del backend.decode
    # Plain afterwards (the prompts computed above are cached by now; they were not while the drafts competed).
    plain = _run_manual(eng, [_chat(eng, CHATS[0], 40, speculate=False), _chat(eng, CHATS[1], 40, speculate=False)])
    assert [r.text for r in spec] == [r.text for r in plain]
    assert spec[0].speculation["accepted"] > 0
    competed, chunks = 0, []
    for rows in steps:
        assert sum(n for _, n, _ in rows) <= 24
        decoding = [n for _, n, every in rows if every]
        prompt = [n for _, n, every in rows if not every]
        if decoding and prompt:
            chunks.append(prompt[0])
            # The drafts (tokens beyond each slot's one) got only what the next tokens and the chunk left.
            assert sum(decoding) - len(decoding) <= 24 - len(decoding) - prompt[0], rows
            competed += sum(decoding) > len(decoding)
    # One slot decoding, the other's prompt in chunks: each a whole chunk but the last (its rest), never cut
    # short for a draft.
    assert len(chunks) >= 2 and all(n == 16 for n in chunks[:-1]) and 0 < chunks[-1] <= 16, chunks
    assert competed, steps  # some step had a draft beside a prompt chunk
    _cells_hold_kv_tokens(eng)


def _run_manual(eng: Engine, reqs: list[GenRequest], stagger: int = 0) -> list:
    first = eng.submit(reqs[0])
    for _ in range(stagger):
        eng.step()
    rest = [eng.submit(r) for r in reqs[1:]]
    _drain(eng)
    return [h.result(timeout=1) for h in [first, *rest]]


def test_a_preempted_speculating_request_resumes_with_the_same_text(manual) -> None:
    eng = manual
    alone = _run_manual(eng, [_chat(eng, CHATS[0], 40, speculate=False)])[0]
    victim = eng.submit(_chat(eng, CHATS[0], 40, priority=Priority.BATCH))
    filler = eng.submit(_chat(eng, CHATS[2], 30))
    for _ in range(6):  # the prompts, two plain steps (the controller's warm-up), then drafts
        eng.step()
    assert not victim.finished
    urgent = eng.submit(GenRequest(eng.tokenize("Hello"), eng.params(temperature=0.0, max_tokens=4), priority=Priority.URGENT))
    eng.step()
    assert victim.job.id not in eng.slots() and urgent.job.id in eng.slots()
    _cells_hold_kv_tokens(eng)  # the saved state held accepted tokens only
    _drain(eng)
    result = victim.result(timeout=1)
    assert result.preemptions == 1 and result.text == alone.text
    assert result.speculation["accepted"] > 0
    filler.result(timeout=1)


def test_an_engine_without_speculation_drafts_nothing(smollm) -> None:
    with Engine.load(smollm, memory=GiB, slots=2, ctx=512, threads=2, speculate=False, start=False) as eng:
        handle = eng.submit(_chat(eng, CHATS[0], 12))
        _drain(eng)
        result = handle.result(timeout=1)
        stats = eng.stats()
    assert result.tokens_out == 12 and not result.speculation["enabled"] and result.speculation["drafted"] == 0
    assert stats["speculate"] is False and stats["spec_drafted"] == 0 and stats["steps"] >= 12


def test_step_cost_charges_a_draft_to_every_decoding_slot() -> None:
    cost = StepCost()
    assert cost.relative(4, 0) == 1.0 and cost.relative(4, 2) == pytest.approx(1.6)  # the prior until it can fit
    for n in (4, 8, 12, 4, 8, 12, 6, 10):
        cost.observe(n, 0.010 + 0.001 * n)  # 10 ms a step, 1 ms a token
    a, b = cost.fit()
    assert a == pytest.approx(0.010) and b == pytest.approx(0.001)
    # 4 slots decoding: a step is 14 ms; a draft of 2 adds 2 ms to all four (8 slot-ms: 8/14 of a plain step).
    assert cost.relative(4, 2) == pytest.approx(1 + 4 * 0.002 / 0.014)
    assert cost.relative(1, 2) == pytest.approx(1 + 0.002 / 0.011)


@pytest.mark.slow
def test_gemma3_sliding_window_slots_drop_draft_cells_and_keep_greedy_text(gemma) -> None:
    """Gemma 3's sliding-window layers (512 tokens) must drop rejected draft cells too: answers that run past the
    window, two slots at once, the same text as plain decoding and every slot's cells what it says."""
    prompts = [TEXT * 3, "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3,"]
    with Engine.load(gemma, memory=GiB, slots=2, ctx=1024, threads=2) as eng:
        def run(speculate: bool) -> list:
            return _run(eng, [GenRequest(eng.tokenize(p), eng.params(temperature=0.0, max_tokens=450), speculate=speculate)
                              for p in prompts])

        plain, spec = run(False), run(True)
        assert [r.text for r in spec] == [r.text for r in plain]
        assert all(len(eng.tokenize(p)) + r.tokens_out > 512 for p, r in zip(prompts, spec, strict=True))  # past the window
        assert all(r.speculation["accepted"] > 0 for r in spec)
        _cells_hold_kv_tokens(eng)


def test_a_cache_that_refuses_to_drop_draft_cells_recomputes_and_stops_drafting(smollm, caplog) -> None:
    """Where llama.cpp refuses to remove a sequence's tail (a recurrent or sliding-window cache may), the slot
    recomputes what it accepted and its request drafts no more. The recomputed cells come from one batch, not
    token by token, and round differently (llama.cpp picks other kernels for a multi-token batch): the text may
    leave plain decoding's at a later near-tie, so only what holds exactly is checked."""
    with Engine.load(smollm, memory=GiB, slots=2, ctx=512, threads=2, start=False) as eng:
        plain = _run_manual(eng, [_chat(eng, CHATS[1], 40, speculate=False)])[0]
        refused = []
        for slot in eng._loop.slots:
            view = slot.kv.backend
            keep = view.remove

            def remove(start, end=-1, keep=keep):
                if start > 0 and end == -1:  # a tail: refused, as a cache that cannot drop it answers
                    refused.append(start)
                    return False
                return keep(start, end)

            view.remove = remove
        caplog.set_level("WARNING", logger="runtime.llm.speculative")
        spec = _run_manual(eng, [_chat(eng, CHATS[1], 40)])[0]
        assert refused and spec.text[:60] == plain.text[:60] and spec.stop_reason in ("eos", "length")
        assert spec.speculation["drafted"] > 0 and not spec.speculation["on"]
        assert "speculation disabled: the KV cache cannot drop draft cells in place" in caplog.text
        _cells_hold_kv_tokens(eng)
