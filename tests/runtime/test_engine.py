"""The continuous-batching engine on the real default model: several sequences in one llama_decode per step,
the same greedy text as the single-stream LLM, joining mid-run, prefix reuse, preemption, deadlines, cancel."""

from __future__ import annotations

import asyncio
import time

import pytest

from runtime.errors import BackendError, BadInput, Cancelled, DeadlineExceeded, QueueFull
from runtime.llm.model import LLM
from runtime.serving.engine import Engine, GenRequest
from runtime.serving.scheduler import Priority

GiB = 1 << 30
PROMPTS = ["The three primary colors are", "Once upon a time", "def fibonacci(n):", "The capital of France is",
           "My favourite recipe for bread", "1, 2, 3, 4,"]
SYSTEM = ("You are a careful assistant for a small factory. Answer in one short sentence, name the machine, and never "
          "guess a number you were not given. Question: ")


@pytest.fixture(scope="module")
def single(smollm):
    with LLM.load(smollm, memory=GiB, ctx=2048, threads=2) as llm:
        yield llm


@pytest.fixture(scope="module")
def reference(single):
    """Each prompt's single-stream greedy answer (text), computed once."""
    seen: dict[tuple[str, int], str] = {}

    def answer(prompt: str, max_tokens: int) -> str:
        if (prompt, max_tokens) not in seen:
            seen[prompt, max_tokens] = single.generate(prompt, single.params(temperature=0.0, max_tokens=max_tokens)).text
        return seen[prompt, max_tokens]

    return answer


@pytest.fixture(scope="module")
def engine(smollm):
    with Engine.load(smollm, memory=GiB, slots=4, ctx=512, threads=2) as eng:
        yield eng


@pytest.fixture(scope="module")
def manual(smollm):
    """Two slots, no thread: the test drives each step."""
    with Engine.load(smollm, memory=GiB, slots=2, ctx=512, threads=2, max_queued=3, start=False) as eng:
        yield eng


def _greedy(eng: Engine, prompt: str, n: int, **kw) -> GenRequest:
    return GenRequest(eng.tokenize(prompt), eng.params(temperature=0.0, max_tokens=n), **kw)


def _drain(eng: Engine) -> None:
    while eng.step():
        pass


def test_four_concurrent_requests_decode_together_and_equal_single_stream(engine, reference) -> None:
    before = engine.stats()
    handles = [engine.submit(_greedy(engine, p, 24)) for p in PROMPTS[:4]]
    results = [h.result(timeout=300) for h in handles]
    after = engine.stats()
    for prompt, result in zip(PROMPTS[:4], results, strict=True):
        assert result.text == reference(prompt, 24), prompt
        assert result.tokens_out == 24 and result.stop_reason == "length" and result.n_ctx == 512
    decoded = after["tokens_decoded"] - before["tokens_decoded"]
    steps = after["steps"] - before["steps"]
    assert decoded == 4 * 24
    # One llama_decode per step for all slots: far fewer steps than tokens (one request at a time would need 96).
    assert steps <= 24 + 8, (steps, decoded)


def test_requests_join_between_steps(engine, reference) -> None:
    first = [engine.submit(_greedy(engine, p, 32)) for p in PROMPTS[:2]]
    streams = [h.events(timeout=300) for h in first]
    pieces = [[next(stream)] for stream in streams]  # both are decoding now
    busy = engine.stats()["slots_busy"]
    later = [engine.submit(_greedy(engine, p, 12)) for p in PROMPTS[4:6]]
    results = [h.result(timeout=300) for h in later]
    for got, stream in zip(pieces, streams, strict=True):
        got.extend(stream)
    assert busy == 2
    for prompt, result in zip(PROMPTS[4:6], results, strict=True):
        assert result.text == reference(prompt, 12)
    for prompt, events in zip(PROMPTS[:2], pieces, strict=True):
        assert events[-1].kind == "done" and events[-1].result.queue_ms >= 0
        assert "".join(e.text for e in events) == events[-1].result.text == reference(prompt, 32)


def test_a_shared_start_is_reused(engine, reference) -> None:
    hits = engine.stats()["prefix_cache"]["hits"]
    a = engine.generate(_greedy(engine, SYSTEM + "which press is loudest?", 8), timeout=300)
    b = engine.generate(_greedy(engine, SYSTEM + "which belt is slowest?", 8), timeout=300)
    assert a.reused_tokens < len(engine.tokenize(SYSTEM)) - 1
    assert b.prefix_cache_hit and b.reused_tokens >= len(engine.tokenize(SYSTEM)) - 1
    assert engine.stats()["prefix_cache"]["hits"] > hits
    assert b.text == reference(SYSTEM + "which belt is slowest?", 8)


def test_a_chats_next_turn_gets_its_answer_back_after_every_slot_served_others(engine) -> None:
    """A finished request's prompt AND answer go to the prefix cache (superseding the prompt's entry): the next turn of
    a chat restores both, even after other requests took every slot and overwrote its cells."""
    chat = [{"role": "system", "content": "You are a helpful assistant for a household."},
            {"role": "user", "content": "Name three vegetables that grow well in a cold climate."}]

    def ask(messages: list[dict[str, str]]):
        tokens, _ = engine.chat_prompt(messages)
        return engine.generate(GenRequest(tokens, engine.params(temperature=0.0, max_tokens=24)), timeout=300)

    first = ask(chat)
    others = [engine.submit(_greedy(engine, p, 16)) for p in PROMPTS[:4]]  # four slots, four other requests at once
    for handle in others:
        handle.result(timeout=300)
    chat += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "Say that again in one sentence."}]
    second = ask(chat)
    assert second.reuse_source == "saved", second.reuse_source
    # the answer's tokens (all but the last sampled one) come back, not only the first turn's prompt
    assert second.reused_tokens >= first.tokens_in + first.tokens_out - 2, (second.reused_tokens, first.tokens_in, first.tokens_out)


def test_saved_prefix_restores_into_another_slot(manual, reference) -> None:
    eng = manual
    one = eng.submit(_greedy(eng, SYSTEM + "which press is loudest?", 6))
    other = eng.submit(_greedy(eng, "Once upon a time", 40))  # holds the other slot while the next one comes
    eng.step()
    slot_of_one = eng.slots().index(one.job.id)
    while not one.finished:
        eng.step()
    # The first slot is free again but its cells now hold the system prompt; take it with an unrelated prompt.
    blocker = eng.submit(_greedy(eng, "Zebras", 4))
    eng.step()
    assert eng.slots()[slot_of_one] == blocker.job.id
    _drain(eng)
    three = eng.submit(_greedy(eng, SYSTEM + "which belt is slowest?", 6))
    _drain(eng)
    result = three.result(timeout=1)
    assert result.reuse_source == "saved" and result.reused_tokens >= len(eng.tokenize(SYSTEM)) - 1
    assert result.text == reference(SYSTEM + "which belt is slowest?", 6)
    assert other.result(timeout=1).text == reference("Once upon a time", 40)


def test_urgent_request_preempts_batch_work_which_resumes_unchanged(manual, reference) -> None:
    eng = manual
    batch = [eng.submit(_greedy(eng, p, 20, priority=Priority.BATCH)) for p in PROMPTS[:2]]
    for _ in range(6):
        eng.step()
    assert set(eng.slots()) == {h.job.id for h in batch}
    urgent = eng.submit(_greedy(eng, PROMPTS[3], 8, priority=Priority.URGENT))
    before = eng.stats()["preemptions"]
    eng.step()
    assert eng.stats()["preemptions"] == before + 1
    assert urgent.job.id in eng.slots()
    preempted = [h for h in batch if h.job.id not in eng.slots()]
    assert len(preempted) == 1 and eng.stats()["queued"]["batch"] == 1  # requeued, not dropped
    _drain(eng)
    assert urgent.result(timeout=1).text == reference(PROMPTS[3], 8)
    for prompt, handle in zip(PROMPTS[:2], batch, strict=True):
        result = handle.result(timeout=1)
        assert result.text == reference(prompt, 20), prompt
        assert result.tokens_out == 20 and result.preemptions == (handle is preempted[0])


def test_preempted_sampled_request_resumes_with_its_sampler(manual) -> None:
    eng = manual
    params = eng.params(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, max_tokens=20, seed=77)
    alone = eng.submit(GenRequest(eng.tokenize("Once upon a time"), params, priority=Priority.BATCH))
    _drain(eng)
    baseline = alone.result(timeout=1).text
    victim = eng.submit(GenRequest(eng.tokenize("Once upon a time"), params, priority=Priority.BATCH))
    filler = eng.submit(_greedy(eng, "The capital of France is", 30, priority=Priority.INTERACTIVE))
    for _ in range(5):
        eng.step()
    urgent = eng.submit(_greedy(eng, "1, 2, 3, 4,", 6, priority=Priority.URGENT))
    eng.step()
    assert victim.job.id not in eng.slots() and urgent.job.id in eng.slots()
    _drain(eng)
    result = victim.result(timeout=1)
    assert result.preemptions == 1 and result.text == baseline
    filler.result(timeout=1)


def test_preemption_without_a_prefix_cache_recomputes_and_resumes(smollm, reference) -> None:
    with Engine.load(smollm, memory=GiB, slots=1, ctx=512, threads=2, prefix_cache_bytes=0, start=False) as eng:
        victim = eng.submit(_greedy(eng, PROMPTS[0], 16, priority=Priority.BATCH))
        for _ in range(8):
            eng.step()
        urgent = eng.submit(_greedy(eng, PROMPTS[1], 4, priority=Priority.URGENT))
        eng.step()
        assert eng.slots() == [urgent.job.id]
        _drain(eng)
        assert urgent.result(timeout=1).text == reference(PROMPTS[1], 4)
        result = victim.result(timeout=1)
        assert result.preemptions == 1 and result.text == reference(PROMPTS[0], 16)


def test_cancel_frees_the_slot_on_the_next_step(manual) -> None:
    eng = manual
    handle = eng.submit(_greedy(eng, PROMPTS[0], 50))
    eng.step()
    eng.step()
    assert handle.job.id in eng.slots()
    handle.cancel()
    eng.step()
    assert handle.job.id not in eng.slots()
    events = list(handle.events(timeout=1))
    assert events[-1].kind == "error" and isinstance(events[-1].error, Cancelled)
    _drain(eng)


def test_deadline_frees_the_slot_at_once(manual) -> None:
    eng = manual
    running = eng.submit(_greedy(eng, PROMPTS[0], 50, deadline=time.monotonic() + 0.3))
    eng.step()
    assert running.job.id in eng.slots()
    time.sleep(0.35)
    eng.step()
    assert running.job.id not in eng.slots()
    with pytest.raises(DeadlineExceeded, match="deadline passed after"):
        running.result(timeout=1)
    # Queued past its deadline while the slots are busy: answered at the next step, not when a slot frees.
    busy = [eng.submit(_greedy(eng, p, 30)) for p in PROMPTS[:2]]
    eng.step()
    late = eng.submit(_greedy(eng, PROMPTS[2], 4, deadline=time.monotonic() + 0.05))
    time.sleep(0.1)
    eng.step()
    with pytest.raises(DeadlineExceeded, match="while queued"):
        late.result(timeout=0.1)
    for h in busy:
        h.cancel()
    _drain(eng)


def test_queue_full_at_the_bound(manual) -> None:
    eng = manual  # max_queued=3 per class
    queued = [eng.submit(_greedy(eng, PROMPTS[0], 2)) for _ in range(3)]
    with pytest.raises(QueueFull) as info:
        eng.submit(_greedy(eng, PROMPTS[0], 2))
    assert info.value.retry_after > 0
    eng.submit(_greedy(eng, PROMPTS[0], 2, priority=Priority.BATCH))  # another class has its own bound
    _drain(eng)
    assert all(h.result(timeout=1).tokens_out == 2 for h in queued)


def test_prompt_that_does_not_fit_a_slot(manual) -> None:
    eng = manual
    long = eng.tokenize("word " * 600)
    with pytest.raises(BadInput, match=rf"the prompt has {len(long)} tokens but a slot holds 512"):
        eng.submit(GenRequest(long, eng.params(temperature=0.0, max_tokens=8)))
    handle = eng.submit(GenRequest(long, eng.params(temperature=0.0, max_tokens=8), truncate=True))
    assert [t.kind for t in handle.truncations] == ["prompt"]  # known at once, before any text
    _drain(eng)
    result = handle.result(timeout=1)
    assert result.truncated and result.truncations[0].kind == "prompt"
    assert result.truncations[0].tokens_dropped == len(long) - (512 - 8) and result.tokens_in == len(long)
    with pytest.raises(BadInput, match="not a token of this model"):
        eng.submit(GenRequest([1, eng.n_vocab], eng.params()))


def test_asyncio_reader_and_chat_prompt(engine, single) -> None:
    messages = [{"role": "user", "content": "Name a colour."}]
    tokens, truncations = engine.chat_prompt(messages)
    assert truncations == []
    params = engine.params(temperature=0.0, max_tokens=10)

    async def read() -> str:
        handle = engine.submit(GenRequest(tokens, params))
        return "".join([e.text async for e in handle.aevents() if e.kind == "text"])

    text = asyncio.run(read())
    assert text == single.chat(messages, params).finish().text


def test_close_cancels_queued_and_running(smollm) -> None:
    eng = Engine.load(smollm, memory=GiB, slots=1, ctx=256, threads=2, start=False)
    later = _greedy(eng, PROMPTS[1], 3)
    running = eng.submit(_greedy(eng, PROMPTS[0], 30))
    eng.step()
    queued = eng.submit(_greedy(eng, PROMPTS[1], 30))
    eng.close()
    for handle in (running, queued):
        with pytest.raises(Cancelled):
            handle.result(timeout=1)
    with pytest.raises(Cancelled):
        eng.submit(later)


def test_a_full_slot_shifts_its_context_like_the_single_stream(smollm) -> None:
    with LLM.load(smollm, memory=GiB, ctx=256, threads=2) as llm:
        tokens = llm.tokenize(", ".join(str(i) for i in range(1, 200)))[:190]  # the count goes on past the context
        params = llm.params(temperature=0.0, max_tokens=90, repeat_penalty=1.0)
        expected = llm.generate(tokens, params)
    assert any(t.kind == "shift" for t in expected.truncations)
    with Engine.load(smollm, memory=GiB, slots=2, ctx=256, threads=2, start=False) as eng:
        handle = eng.submit(GenRequest(tokens, params))
        _drain(eng)
        result = handle.result(timeout=1)
    assert result.text == expected.text and result.tokens_out == expected.tokens_out
    assert [(t.kind, t.tokens_dropped, t.at_token) for t in result.truncations] == \
        [(t.kind, t.tokens_dropped, t.at_token) for t in expected.truncations]


def test_a_failed_decode_ends_its_requests_and_the_engine_goes_on(manual, monkeypatch, reference) -> None:
    eng = manual
    doomed = [eng.submit(_greedy(eng, p, 10)) for p in PROMPTS[:2]]
    eng.step()
    real = eng.backend.decode

    def broken(rows):
        monkeypatch.setattr(eng.backend, "decode", real)
        raise BackendError("llama.cpp decode of 2 tokens in 2 sequences failed (code -3)")

    monkeypatch.setattr(eng.backend, "decode", broken)
    eng.step()
    assert eng.slots() == [None, None]
    for handle in doomed:
        with pytest.raises(BackendError, match="code -3"):
            handle.result(timeout=1)
    after = eng.submit(_greedy(eng, PROMPTS[2], 6))
    _drain(eng)
    assert after.result(timeout=1).text == reference(PROMPTS[2], 6)


def test_a_reader_that_goes_away_cancels_within_a_step(manual) -> None:
    eng = manual
    handle = eng.submit(_greedy(eng, PROMPTS[0], 50))
    eng.step()
    eng.step()
    stream = handle.events(timeout=1)
    assert next(stream).kind == "text"
    stream.close()  # a client that disconnected: the server stops reading
    eng.step()
    assert handle.job.id not in eng.slots() and handle.finished

    async def read_one(h) -> str:
        async for event in h.aevents():
            return event.kind  # leaves the async generator: closed, and the request cancelled
        return ""

    other = eng.submit(_greedy(eng, PROMPTS[1], 50))
    eng.step()
    eng.step()
    assert asyncio.run(read_one(other)) == "text"
    eng.step()
    assert other.job.id not in eng.slots() and other.finished
    _drain(eng)


def test_a_chat_that_dropped_turns_reuses_the_cells_after_the_gap(manual) -> None:
    eng = manual
    words = lambda text: eng.backend.tokenize(text, add_bos=False, special=False)  # noqa: E731
    head = eng.tokenize(SYSTEM)
    old_turn = words(" Which press is the loudest one on the floor today, and why is it so loud?")
    kept = words(" The belt on line two has been slowing down since the morning shift began; what should I check first?")
    first = eng.submit(GenRequest(head + old_turn + kept, eng.params(temperature=0.0, max_tokens=4)))
    _drain(eng)
    first.result(timeout=1)
    second = eng.submit(GenRequest(head + kept + words(" Answer briefly."), eng.params(temperature=0.0, max_tokens=4)))
    _drain(eng)
    result = second.result(timeout=1)
    assert result.reuse_source == "kv+shift" and result.reused_tokens >= len(head) + len(kept) - 1
