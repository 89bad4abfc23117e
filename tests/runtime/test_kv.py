"""KVSequence and PrefixCache through a fake backend: exactly what is reused, recomputed, shifted or evicted."""

from __future__ import annotations

import pytest

from runtime.llm.kv import MIN_REUSE, PROBE, KVSequence, Reuse
from runtime.llm.prefix_cache import PrefixCache, common_prefix
from tests.runtime.fake_backend import CELL, FakeBackend


def seq(start: int, n: int) -> list[int]:
    """``n`` distinct tokens from ``start`` (no repeats, so a probe matches in one place only)."""
    return list(range(start, start + n))


def filled(tokens: list[int], *, n_ctx: int = 64, cache_bytes: int = 0) -> tuple[FakeBackend, KVSequence]:
    backend = FakeBackend(n_ctx)
    kv = KVSequence(backend, PrefixCache(cache_bytes))
    kv.append(tokens)
    return backend, kv


# -- the live cache ------------------------------------------------------------------------
def test_an_extended_prompt_reuses_the_live_cache() -> None:
    backend, kv = filled(seq(100, 20))
    reuse = kv.prepare(seq(100, 20) + seq(200, 5))
    assert reuse == Reuse(20, "kv")
    assert backend.contents() == kv.tokens == seq(100, 20)
    assert kv.cache.hits == 1 and kv.cache.misses == 0


def test_the_last_prompt_token_is_always_left_to_decode() -> None:
    backend, kv = filled(seq(100, 20))
    reuse = kv.prepare(seq(100, 20))  # the same prompt again: its logits must be fresh
    assert reuse == Reuse(19, "kv")
    assert backend.contents() == kv.tokens == seq(100, 19)


def test_a_diverging_prompt_keeps_only_the_common_prefix() -> None:
    backend, kv = filled(seq(100, 20))
    reuse = kv.prepare(seq(100, 7) + seq(300, 10))
    assert reuse == Reuse(7, "kv")
    assert backend.contents() == kv.tokens == seq(100, 7)


def test_a_cache_that_cannot_drop_its_tail_starts_over() -> None:
    backend, kv = filled(seq(100, 20))
    backend.can_remove = False  # a sliding-window cache
    reuse = kv.prepare(seq(100, 7) + seq(300, 10))
    assert reuse == Reuse(0, "none")
    assert backend.cells == {} and kv.tokens == []
    assert kv.cache.misses == 1 and kv.cache.hits == 0


def test_append_past_the_context_is_a_bug_not_a_truncation() -> None:
    backend, kv = filled(seq(100, 60))
    with pytest.raises(ValueError, match="overflow"):
        kv.append(seq(200, 5))
    assert backend.contents() == seq(100, 60)


# -- context shift -------------------------------------------------------------------------------
def test_shift_moves_the_cells_down_without_recomputing() -> None:
    backend, kv = filled(seq(100, 40))
    decoded = backend.decoded
    assert kv.shift(4, 10) == 10
    kept = seq(100, 4) + seq(114, 26)
    assert backend.contents() == kv.tokens == kept
    assert backend.decoded == decoded


def test_shift_recomputes_what_it_keeps_when_cells_cannot_move() -> None:
    backend, kv = filled(seq(100, 40))
    backend.shift_ok = False
    decoded = backend.decoded
    assert kv.shift(4, 10) == 10
    kept = seq(100, 4) + seq(114, 26)
    assert backend.contents() == kv.tokens == kept
    assert backend.decoded == decoded + 30  # the recompute path: every kept token evaluated again


def test_shift_never_drops_more_than_there_is() -> None:
    backend, kv = filled(seq(100, 12))
    assert kv.shift(4, 100) == 8
    assert backend.contents() == kv.tokens == seq(100, 4)
    assert kv.shift(4, 5) == 0


# -- a gap: the oldest turns dropped from a conversation ---------------------------------------
def test_cells_after_a_dropped_range_are_shifted_not_recomputed() -> None:
    system, old_turn, kept_turns = seq(100, 10), seq(200, 12), seq(300, MIN_REUSE + PROBE + 4)
    backend, kv = filled(system + old_turn + kept_turns)
    prompt = system + kept_turns + seq(400, 3)
    reuse = kv.prepare(prompt)
    assert reuse == Reuse(len(system) + len(kept_turns), "kv+shift")
    assert backend.contents() == kv.tokens == system + kept_turns  # positions contiguous again
    decoded = backend.decoded
    kv.append(prompt[reuse.tokens :])
    assert backend.decoded == decoded + 3


def test_no_gap_shift_where_cells_cannot_move() -> None:
    system, old_turn, kept_turns = seq(100, 10), seq(200, 12), seq(300, MIN_REUSE + PROBE + 4)
    backend, kv = filled(system + old_turn + kept_turns)
    backend.shift_ok = False
    reuse = kv.prepare(system + kept_turns + seq(400, 3))
    assert reuse == Reuse(len(system), "kv")
    assert backend.contents() == kv.tokens == system


def test_a_short_run_after_the_gap_is_not_worth_a_shift() -> None:
    system, old_turn = seq(100, 10), seq(200, 12)
    short = seq(300, MIN_REUSE - 1)
    backend, kv = filled(system + old_turn + short + seq(500, PROBE + 2))
    reuse = kv.prepare(system + short + seq(400, 20))
    assert reuse == Reuse(len(system), "kv")


# -- saved prefixes -------------------------------------------------------------------------------
def test_a_saved_prefix_is_restored_when_it_covers_more() -> None:
    shared = seq(100, MIN_REUSE + 10)
    backend, kv = filled(shared, cache_bytes=1 << 16)
    kv.save_prefix()
    assert backend.saves == 1 and len(kv.cache) == 1 and kv.cache.bytes == CELL.size * len(shared)
    kv.clear()
    kv.append(seq(900, 5))  # an unrelated request took the live cache
    reuse = kv.prepare(shared + seq(200, 4))
    assert reuse == Reuse(len(shared), "saved")
    assert backend.loads == 1
    assert backend.contents() == kv.tokens == shared


def test_a_saved_prefix_shorter_than_the_live_one_is_not_loaded() -> None:
    shared = seq(100, MIN_REUSE + 10)
    backend, kv = filled(shared, cache_bytes=1 << 16)
    kv.save_prefix()
    kv.append(seq(200, 4))
    reuse = kv.prepare(shared + seq(200, 4) + seq(300, 2))
    assert reuse == Reuse(len(shared) + 4, "kv")
    assert backend.loads == 0


def test_a_saved_prefix_must_beat_the_live_one_by_min_reuse() -> None:
    shared = seq(100, MIN_REUSE + 10)
    backend, kv = filled(shared, cache_bytes=1 << 16)
    kv.save_prefix()
    kv.prepare(shared[:20] + seq(900, 3))  # the live cache keeps 20 of the saved 26
    kv.append(seq(900, 3))
    reuse = kv.prepare(shared + seq(200, 4))
    assert reuse == Reuse(20, "kv")  # 6 more tokens are not worth a state load
    assert backend.loads == 0


def test_a_failed_load_does_not_reuse_the_cells_it_wiped() -> None:
    system, kept_turns = seq(100, 10), seq(300, MIN_REUSE + PROBE + 4)
    backend, kv = filled(system + kept_turns, cache_bytes=1 << 16)
    kv.save_prefix()
    kv.clear()
    kv.append(seq(900, 5) + system + kept_turns)  # a gap shift could reuse these, had the load not wiped them
    backend.load_ok = False
    prompt = system + kept_turns + seq(400, 3)
    assert kv.prepare(prompt) == Reuse(0, "none")
    assert backend.cells == {} and kv.tokens == []
    kv.append(prompt)
    assert backend.contents() == prompt


def test_a_saved_state_that_fails_to_load_leaves_an_empty_cache() -> None:
    shared = seq(100, MIN_REUSE + 10)
    backend, kv = filled(shared, cache_bytes=1 << 16)
    kv.save_prefix()
    kv.clear()
    kv.append(seq(900, 5))
    backend.load_ok = False
    reuse = kv.prepare(shared + seq(200, 4))
    assert reuse == Reuse(0, "none")
    assert backend.loads == 1 and backend.cells == {} and kv.tokens == []
    assert kv.cache.misses == 1 and kv.cache.hits == 0


def test_short_or_oversized_prefixes_are_not_saved() -> None:
    backend, kv = filled(seq(100, MIN_REUSE - 1), cache_bytes=1 << 16)
    kv.save_prefix()
    assert backend.saves == 0 and len(kv.cache) == 0
    tokens = seq(100, MIN_REUSE + 4)
    backend, kv = filled(tokens, cache_bytes=CELL.size * len(tokens) - 1)
    kv.save_prefix()  # larger than the whole cache: never copied out of the backend
    assert backend.saves == 0 and len(kv.cache) == 0 and kv.cache.bytes == 0


# -- PrefixCache on its own --------------------------------------------------------------------
def test_prefix_cache_evicts_the_least_recently_used() -> None:
    cache = PrefixCache(100)
    a, b, c = (1, 2, 3), (4, 5, 6), (7, 8, 9)
    assert cache.put(a, b"x" * 40) and cache.put(b, b"y" * 40)
    entry, n = cache.best([1, 2, 99])  # touches a
    assert entry is not None and entry.tokens == a and n == 2
    assert cache.put(c, b"z" * 40)
    assert cache.best([4, 5, 6]) == (None, 0)  # b went, not a
    assert cache.best([1, 2, 3])[1] == 3
    assert cache.stats() == {"hits": 0, "misses": 0, "entries": 2, "bytes": 80, "capacity_bytes": 100, "evictions": 1,
                             "superseded": 0}


def test_make_room_refuses_what_can_never_fit_and_evicts_nothing() -> None:
    cache = PrefixCache(100)
    cache.put((1,), b"x" * 60)
    assert not cache.make_room(101)
    assert not cache.put((2,), b"y" * 101)
    assert len(cache) == 1 and cache.bytes == 60 and cache.evictions == 0
    assert cache.make_room(100)  # fits once everything else is gone
    assert len(cache) == 0 and cache.bytes == 0 and cache.evictions == 1


def test_putting_the_same_prefix_again_replaces_it() -> None:
    cache = PrefixCache(100)
    cache.put((1, 2), b"x" * 40)
    cache.put((3, 4), b"y" * 40)
    cache.put((1, 2), b"z" * 50)
    assert len(cache) == 2 and cache.bytes == 90 and cache.evictions == 0
    entry, _ = cache.best([1, 2])
    assert entry is not None and entry.state == b"z" * 50


def test_the_best_entry_shares_the_longest_prefix() -> None:
    cache = PrefixCache(1000)
    cache.put((1, 2, 3, 4), b"a")
    cache.put((1, 2, 7, 8, 9), b"b")
    cache.put((5,), b"c")
    entry, n = cache.best([1, 2, 3, 9])
    assert entry is not None and entry.state == b"a" and n == 3
    assert cache.best([6, 1, 2]) == (None, 0)


def test_prefix_cache_edges() -> None:
    with pytest.raises(ValueError):
        PrefixCache(-1)
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2, 3], [1, 2, 3, 4]) == 3
    assert common_prefix([1, 2, 3], [1, 5, 3]) == 1
