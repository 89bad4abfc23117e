"""Chats that alternate (several users, one model): each turn's prompt+answer is saved, and it supersedes the
shorter entries it extends, so the next turn of every conversation finds its state and the byte bound holds one
entry per conversation."""

from __future__ import annotations

import pytest

from runtime.llm.kv import MIN_REUSE, KVSequence, Reuse
from runtime.llm.prefix_cache import PrefixCache
from runtime.llm.sampling import SamplingParams
from tests.runtime.fake_backend import CELL, FakeBackend


def seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


# -- PrefixCache on its own -----------------------------------------------------------------------
def test_an_entry_that_extends_another_supersedes_it() -> None:
    cache = PrefixCache(1000)
    cache.put((1, 2, 3), b"a" * 30)
    cache.put((9, 9), b"u" * 20)  # unrelated: kept
    cache.put((1, 2, 3, 4, 5), b"b" * 50)
    assert len(cache) == 2 and cache.bytes == 70 and cache.superseded == 1 and cache.evictions == 0
    entry, n = cache.best([1, 2, 3, 7])  # the longer entry serves the shorter one's prompts
    assert entry is not None and entry.state == b"b" * 50 and n == 3
    cache.put((1, 2, 8), b"c" * 30)  # a branch, not an extension: both kept
    assert len(cache) == 3 and cache.superseded == 1


def test_superseded_entries_make_room_before_anything_is_evicted() -> None:
    cache = PrefixCache(100)
    cache.put((5, 6), b"u" * 40)  # least recently used
    cache.put((1, 2), b"a" * 40)
    assert cache.make_room(55, (1, 2, 3))  # 40 + 40 + 55 > 100, but the entry it extends goes first
    assert cache.bytes == 40 and cache.evictions == 0 and cache.best([5, 6])[1] == 2
    assert cache.put((1, 2, 3), b"b" * 55) and cache.bytes == 95 <= cache.capacity_bytes


def test_a_sliding_window_cache_keeps_the_shorter_entries() -> None:
    cache = PrefixCache(1000, supersede=False)
    cache.put((1, 2, 3), b"a" * 30)
    cache.put((1, 2, 3, 4, 5), b"b" * 50)
    assert len(cache) == 2 and cache.bytes == 80 and cache.superseded == 0


def test_a_longer_saved_state_is_cut_to_the_prompt_it_serves() -> None:
    """What superseding relies on: a state holding more than the prompt shares is loaded and truncated."""
    turn = seq(100, MIN_REUSE + 10)
    answer = seq(500, 12)
    backend = FakeBackend(128)
    kv = KVSequence(backend, PrefixCache(1 << 16))
    kv.append(turn)
    kv.save_prefix()
    kv.append(answer)
    kv.save_prefix()
    assert len(kv.cache) == 1 and kv.cache.bytes == CELL.size * (len(turn) + len(answer))
    kv.clear()
    kv.append(seq(900, 5))  # another user's request took the live cache
    reuse = kv.prepare(turn + seq(700, 4))  # the first turn again, answered otherwise
    assert reuse == Reuse(len(turn), "saved")
    assert backend.contents() == kv.tokens == turn


# -- the real default model ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smol_llm(smollm):
    from runtime.llm.model import LLM

    with LLM.load(smollm, memory="1G", ctx=1024, threads=1) as llm:
        yield llm


CHATS = {
    "a": [{"role": "system", "content": "You are a helpful assistant for a household."},
          {"role": "user", "content": "Name three vegetables that grow well in a cold climate."}],
    "b": [{"role": "system", "content": "You are a helpful assistant for a household."},
          {"role": "user", "content": "How long should I boil an egg for a soft yolk?"}],
}


def test_interleaved_chats_get_their_answers_back_from_the_cache(smol_llm) -> None:
    """Two users take turns: each one's second turn restores its first turn's prompt AND answer, and the cache
    holds one entry per conversation (the prompt's entry superseded by prompt+answer)."""
    llm = smol_llm
    llm.kv.clear()
    llm.prefix_cache._entries.clear()  # noqa: SLF001 - a clean cache for this test's counts
    llm.prefix_cache.bytes = 0
    params = SamplingParams(temperature=0.0, max_tokens=24, seed=1)
    first = {}
    for name, msgs in CHATS.items():
        result = llm.chat(msgs, params).finish()
        first[name] = result
        msgs.append({"role": "assistant", "content": result.text})
        msgs.append({"role": "user", "content": "Thank you. Can you say that again in one short sentence?"})
    assert len(llm.prefix_cache) == 2  # one per conversation: each prompt's entry was superseded
    assert llm.prefix_cache.bytes <= llm.prefix_cache.capacity_bytes
    for name, msgs in CHATS.items():
        result = llm.chat(msgs, params).finish()
        before = first[name]
        assert result.reuse_source == "saved"
        # the answer's tokens (all but the last sampled one) come back, not only the first turn's prompt
        assert result.reused_tokens >= before.tokens_in + before.tokens_out - 2, (result.reused_tokens, before)


# -- a draft model identical to the target: its drafts are the target's own greedy tokens --------------------------
def test_the_target_as_its_own_draft_has_every_forced_draft_accepted(smollm) -> None:
    """Guards the draft model's KV sync (positions, the token it starts from, dropped rejected cells): the same
    GGUF drafting greedily proposes exactly the target's greedy tokens, so forced drafts are all accepted. The
    prompt is shorter than the draft's catch-up window (runtime/llm/draft.py WINDOW): past it the draft restarts on
    the context's last WINDOW tokens by design, sees less than the target and proposes otherwise now and then."""
    from runtime.llm.model import LLM
    from runtime.llm.speculative import Adaptive, Speculator

    class Forced(Adaptive):  # drafts 3 tokens every step, whatever it measures
        def plan(self, limit: int | None = None) -> int:
            return 3 if limit is None else min(3, limit)

    with LLM.load(smollm, memory="1G", ctx=1024, threads=1, draft=str(smollm.path())) as llm:
        llm.speculator = Speculator(llm.draft, Forced())
        params = SamplingParams(temperature=0.0, max_tokens=40, seed=1)
        result = llm.chat([{"role": "user", "content": "Explain how a refrigerator keeps food cold."}], params).finish()
    spec = result.speculation
    assert spec["drafted"] >= 20 and spec["accepted"] >= 0.9 * spec["drafted"], spec
