"""SamplingParams: every value typed and bounded to what llama.cpp takes, from a flag or from a manifest."""

from __future__ import annotations

import pytest

from runtime.errors import BadInput
from runtime.llm.sampling import SamplingParams

# (setting, value, fragment of the one-line error). Each case is a value that used to reach
# llama.cpp (a TypeError there, a ctypes overflow, or a silently wrapped number) or a class of it.
BAD_VALUES = [
    # a number given as a string: `"0.7" >= 0` raised TypeError
    ("temperature", "0.7", "--temperature must be a finite number >= 0 (0 is greedy), got str '0.7'"),
    # JSON true is not the integer 1
    ("top_k", True, "--top-k must be an integer"),
    # a float where llama.cpp takes an int32_t
    ("top_k", 40.5, "--top-k must be an integer"),
    # past int32_t: a ctypes error inside the sampler, or a wrapped value
    ("top_k", 2**31, "--top-k 2147483648 is not valid"),
    ("max_tokens", 2**31, "--max-tokens 2147483648 is not valid"),
    ("max_tokens", None, "--max-tokens must be an integer"),
    # llama.cpp's seed is uint32_t, and 2^32 - 1 means "random" to it
    ("seed", 2**32 - 1, "--seed 4294967295 is not valid: use an integer in [0, 2^32 - 2]"),
    ("seed", -1, "--seed -1 is not valid"),
    ("seed", "7", "--seed must be an integer"),
    ("seed", False, "--seed must be an integer"),
    # comparisons are False for NaN: it must fail the range check, not slip through it
    ("temperature", float("nan"), "--temperature nan is not valid"),
    ("top_p", float("nan"), "--top-p nan is not valid"),
    ("min_p", float("nan"), "--min-p nan is not valid"),
    ("repeat_penalty", float("inf"), "--repeat-penalty inf is not valid"),
    # finite for Python, inf as the C float llama.cpp stores
    ("temperature", 1e39, "--temperature 1e+39 is not valid"),
    # an integer past the float range: float() would raise OverflowError
    ("temperature", 10**400, "--temperature"),
    # a bare string is a sequence of one-character stop strings: refused, not split
    ("stop", "END", "--stop must be a list of non-empty strings (at most 16, each at most 256 characters), got str 'END'"),
    ("stop", ("ok", 3), "--stop must be a list of non-empty strings"),
    ("stop", ("",), "--stop ('',) is not valid: use a list of non-empty strings"),
    # unbounded before: a 4 MB stop made the stream hold back the whole answer, and each one is searched per token
    ("stop", ("x" * 4_000_000,), "--stop ('xxxx"),
    ("stop", ("x" * 257,), "is not valid: use a list of non-empty strings (at most 16, each at most 256 characters)"),
    ("stop", tuple(f"s{i}" for i in range(17)), "--stop ('s0', 's1'"),
]


@pytest.mark.parametrize("key, value, message", BAD_VALUES, ids=[f"{k}={v!r:.20}" for k, v, _ in BAD_VALUES])
def test_bad_flag_values_are_refused_with_the_flag(key: str, value, message: str) -> None:
    with pytest.raises(BadInput) as exc:
        SamplingParams(**{key: value})
    assert message in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("key, value, message", BAD_VALUES, ids=[f"{k}={v!r:.20}" for k, v, _ in BAD_VALUES])
def test_bad_manifest_defaults_name_their_key(key: str, value, message: str) -> None:
    # The same values as manifest defaults: the error names the manifest key, not a flag the user never gave.
    flag = "--" + key.replace("_", "-")
    with pytest.raises(BadInput) as exc:
        SamplingParams.from_defaults({key: value})
    assert message.replace(flag, f"manifest llm.sampling.{key}") in str(exc.value)


def test_limits_themselves_are_accepted() -> None:
    p = SamplingParams(top_k=2**31 - 1, max_tokens=2**31 - 1, seed=2**32 - 2, temperature=3.4e38, top_p=1, min_p=0)
    assert (p.top_k, p.seed) == (2**31 - 1, 2**32 - 2)
    assert isinstance(p.top_p, float) and isinstance(p.min_p, float)  # JSON integers for float settings become floats


def test_stop_limits_themselves_are_accepted() -> None:
    stops = tuple(f"{i:02d}" + "x" * 254 for i in range(16))
    assert SamplingParams(stop=stops).stop == stops
    assert SamplingParams.from_defaults({"stop": list(stops)}).stop == stops


def test_seed_defaults_to_none_meaning_a_fresh_seed_per_request() -> None:
    assert SamplingParams().seed is None
    assert SamplingParams(seed=0).seed == 0
    assert SamplingParams.from_defaults({"seed": 42}).seed == 42
    assert SamplingParams.from_defaults({"seed": 42}, seed=None).seed == 42  # None: no --seed given, keep the bundle's


def test_unknown_manifest_setting_is_refused_with_the_valid_names() -> None:
    # top-k spelled with a dash: silently ignored before, so the bundle's author never learned it had no effect
    with pytest.raises(BadInput, match=r"manifest llm.sampling: unknown setting 'top-k' \(valid: max_tokens, temperature, "
                                       r"top_k, top_p, min_p, repeat_penalty, seed, stop\)"):
        SamplingParams.from_defaults({"top-k": 40})


def test_manifest_defaults_then_overrides() -> None:
    p = SamplingParams.from_defaults({"temperature": 1, "stop": ["\n\n"]}, top_k=5, temperature=None)
    assert (p.temperature, p.top_k, p.stop) == (1.0, 5, ("\n\n",))
    with pytest.raises(BadInput, match="^manifest llm.sampling must be an object"):
        SamplingParams.from_defaults([("temperature", 1)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="unknown sampling settings"):  # a caller's typo is a bug, not user input
        SamplingParams.from_defaults({}, topk=5)
