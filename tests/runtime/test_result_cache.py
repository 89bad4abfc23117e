"""The result cache: exact keys, LRU in bytes, TTL, deterministic requests only, thread safety."""

from __future__ import annotations

import threading

import pytest

from runtime.errors import BadInput
from runtime.llm.sampling import SamplingParams
from runtime.serving.result_cache import ResultCache


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_hits_misses_and_evictions_by_bytes() -> None:
    cache = ResultCache(100)
    assert cache.put("a", "A", 40) and cache.put("b", "B", 40)
    assert cache.get("a") == "A"  # a is now the most recently used
    assert cache.put("c", "C", 40)  # 120 > 100: b (least recently used) goes, not a
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == ("A", None, "C")
    assert cache.put("d", "D", 100)  # takes the whole capacity: both go
    assert cache.get("a") is None and cache.get("c") is None and cache.get("d") == "D"
    assert not cache.put("e", "E", 101)  # larger than the cache: refused, nothing evicted
    assert cache.get("d") == "D"
    assert cache.stats() == {"hits": 5, "misses": 3, "evictions": 3, "expired": 0, "refused": 1, "bytes": 100,
                             "entries": 1, "capacity_bytes": 100}


def test_replacing_a_key_counts_its_bytes_once() -> None:
    cache = ResultCache(100)
    cache.put("a", "A", 60)
    cache.put("a", "A2", 70)
    assert cache.get("a") == "A2" and cache.stats()["bytes"] == 70 and cache.stats()["evictions"] == 0


def test_entries_expire_after_the_ttl() -> None:
    clock = Clock()
    cache = ResultCache(100, ttl_s=10, clock=clock)
    cache.put("a", "A", 10)
    clock.now = 9.99
    assert cache.get("a") == "A"  # a hit does not extend the TTL
    clock.now = 10
    assert cache.get("a") is None
    assert cache.stats()["expired"] == 1 and cache.stats()["bytes"] == 0 and len(cache) == 0


def test_the_key_changes_with_model_version_params_and_input() -> None:
    base = ResultCache.key("smollm2@1", {"temperature": 0, "max_tokens": 8}, {"prompt": "hi"})
    assert base == ResultCache.key("smollm2@1", {"max_tokens": 8, "temperature": 0}, {"prompt": "hi"})  # order-free
    others = [
        ResultCache.key("smollm2@2", {"temperature": 0, "max_tokens": 8}, {"prompt": "hi"}),
        ResultCache.key("smollm2@1", {"temperature": 0, "max_tokens": 9}, {"prompt": "hi"}),
        ResultCache.key("smollm2@1", {"temperature": 0, "max_tokens": 8}, {"prompt": "hi!"}),
        ResultCache.key("smollm2@1", {"temperature": 0, "max_tokens": 8, "seed": 1}, {"prompt": "hi"}),
        # the fields are kept apart: moving text from one part to another is another key
        ResultCache.key("smollm2@1", {"temperature": 0, "max_tokens": 8, "prompt": "hi"}, {}),
    ]
    assert len({base, *others}) == 6
    image = ResultCache.key("digits@1", {}, b"\x89PNG...")
    assert image != ResultCache.key("digits@1", {}, b"\x89PNG..!") and len(image) == 64
    params = SamplingParams(max_tokens=8, stop=("\n",))
    assert ResultCache.key("m", params, "x") == ResultCache.key("m", SamplingParams(max_tokens=8, stop=("\n",)), "x")
    assert ResultCache.key("m", params, "x") != ResultCache.key("m", SamplingParams(max_tokens=9, stop=("\n",)), "x")


def test_bytes_and_a_mapping_that_looks_like_their_digest_are_different_keys() -> None:
    # Otherwise a request whose JSON input is {"sha256": <an image's digest>} is cached under that image's key, and
    # the image's requests are answered with its result (and the other way round).
    import hashlib

    image = b"\x89PNG..."
    lookalike = {"sha256": hashlib.sha256(image).hexdigest()}
    assert ResultCache.key("m", {}, image) != ResultCache.key("m", {}, lookalike)
    assert ResultCache.key("m", {}, [image]) != ResultCache.key("m", {}, [lookalike])
    assert ResultCache.key("m", {"x": image}, "") != ResultCache.key("m", {"x": lookalike}, "")


@pytest.mark.parametrize("bad", [float("nan"), {1, 2}, object()])
def test_values_without_a_canonical_form_are_refused(bad) -> None:
    with pytest.raises(BadInput, match="result cache: cannot key"):
        ResultCache.key("m", {"x": bad}, "")


@pytest.mark.parametrize(("params", "cacheable"), [
    ({"temperature": 0}, True),
    ({"temperature": 0.0, "top_p": 0.5}, True),
    ({"temperature": 0.7, "seed": 42}, True),
    ({"temperature": 0.7, "seed": 0}, True),  # seed 0 is a seed
    ({"temperature": 0.7}, False),
    ({"temperature": 0.7, "seed": None}, False),
    ({}, False),  # the model's default temperature: not known to be 0
    ({"temperature": False}, False),  # not a number
    ({"temperature": 0.7, "seed": True}, False),
    (SamplingParams(temperature=0.0), True),
    (SamplingParams(temperature=0.8), False),
    (SamplingParams(temperature=0.8, seed=7), True),
])
def test_only_deterministic_requests_are_cacheable(params, cacheable) -> None:
    assert ResultCache.cacheable(params) is cacheable


def test_bad_settings_are_refused() -> None:
    for capacity, ttl in ((-1, 10), (100, 0), (100, float("inf"))):
        with pytest.raises(BadInput):
            ResultCache(capacity, ttl_s=ttl)
    with pytest.raises(BadInput, match="size_bytes"):
        ResultCache(10).put("a", "A", -1)
    assert not ResultCache(0).put("a", "A", 1)  # capacity 0: the cache is off


def test_concurrent_puts_and_gets_keep_the_byte_count_exact() -> None:
    cache = ResultCache(64 * 100)
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(2000):
                key = f"k{(t * 7 + i) % 300}"
                value = cache.get(key)
                assert value is None or value == key.upper()
                cache.put(key, key.upper(), 64 + i % 3)
        except BaseException as exc:  # noqa: BLE001 - reported to the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    stats = cache.stats()
    assert stats["hits"] + stats["misses"] == 8 * 2000
    assert stats["bytes"] <= stats["capacity_bytes"]
    assert stats["bytes"] == sum(size for _, size, _ in cache._entries.values())


def test_one_scope_never_answers_another() -> None:
    # The server scopes entries by a digest of the caller's API key: a hit must not tell one key what another asked.
    cache = ResultCache(1 << 20)
    params, payload = {"temperature": 0}, {"prompt": "hi"}
    a, b = ResultCache.key("m@1", params, payload, scope="a" * 64), ResultCache.key("m@1", params, payload, scope="b" * 64)
    assert a != b and a != ResultCache.key("m@1", params, payload)
    assert a == ResultCache.key("m@1", params, payload, scope="a" * 64)
    cache.put(a, "answer", 6)
    assert cache.get(b) is None and cache.get(a) == "answer"
    with pytest.raises(BadInput, match="scope must be a string"):
        ResultCache.key("m@1", params, payload, scope=b"a")  # type: ignore[arg-type]
