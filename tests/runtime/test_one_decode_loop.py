"""One decode loop: the single stream and every engine slot drive the same Decoding (runtime/llm/decoding.py), with
one sampler chain (runtime/backends/llamacpp.py). The rules that used to be written twice stay written once."""

from __future__ import annotations

import ast
from pathlib import Path

from runtime.llm.decoding import Decoding, fit_prompt
from runtime.llm.generation import Generation
from runtime.llm.language_model import LanguageModel
from runtime.llm.model import LLM
from runtime.serving.engine import Engine
from runtime.serving.engine_seq import SeqState

ROOT = Path(__file__).resolve().parents[2]


def _calls(attr: str) -> list[str]:
    """Files under runtime/ and apps/ that call ``<anything>.attr(...)`` or ``attr(...)``."""
    out = []
    for path in sorted([*(ROOT / "runtime").rglob("*.py"), *(ROOT / "apps").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
                if name == attr:
                    out.append(path.relative_to(ROOT).as_posix())
                    break
    return out


def test_each_rule_of_a_generation_is_written_once_in_the_decoding() -> None:
    # UTF-8 assembly across tokens, fresh seeds, stop strings and the answer's room: one home each.
    assert _calls("getincrementaldecoder") == ["runtime/llm/decoding.py"]
    assert _calls("randbelow") == ["runtime/llm/decoding.py"]
    assert _calls("find_stop") == ["runtime/llm/decoding.py"]
    assert _calls("fit_prompt") == ["runtime/llm/decoding.py"]
    # the context shift's report: the Decoding records it, both drivers call it
    assert sorted(_calls("shifted")) == ["runtime/llm/generation.py", "runtime/serving/engine_loop.py"]


def test_one_sampler_chain_for_every_sequence() -> None:
    # the grammar stage of structured output is added to this one chain
    assert _calls("add_penalties") == ["runtime/backends/llamacpp.py"]
    assert _calls("_init_sampler") == []


def test_the_single_stream_and_the_engine_share_the_decoding_and_the_text_side() -> None:
    assert issubclass(SeqState, Decoding)
    assert issubclass(LLM, LanguageModel) and issubclass(Engine, LanguageModel)
    assert "seq" in Generation.__init__.__code__.co_varnames
    # no method of the LLM is copied onto the engine as a class attribute
    assert all(getattr(Engine, name) is getattr(LanguageModel, name) for name in ("params", "tokenize", "fit_chat"))


def test_the_fit_of_a_prompt_refuses_or_cuts_by_one_rule() -> None:
    cuts: list = []
    assert fit_prompt(list(range(10)), 64, 16, 1, truncate=False, truncations=cuts) == list(range(10))
    tokens = fit_prompt(list(range(100)), 64, 16, 1, truncate=True, truncations=cuts)
    assert len(tokens) == 64 - 16 and tokens[0] == 0 and tokens[-1] == 99 and cuts[0].tokens_dropped == 52
    try:
        fit_prompt(list(range(100)), 64, 16, 1, truncate=False, truncations=[])
    except Exception as exc:  # BadInput naming the count and the limit
        assert "the prompt has 100 tokens but a slot holds 64, 48 of them for the prompt" in str(exc)
    else:
        raise AssertionError("a prompt that does not fit was not refused")


def test_a_decoding_keeps_back_text_that_could_become_a_stop_string() -> None:
    class Vocab:
        def is_eog(self, token: int) -> bool:
            return token == 0

        def token_bytes(self, token: int) -> bytes:
            return {1: b"Hel", 2: b"lo", 3: b" EN", 4: b"D", 5: "\u00e9".encode()[:1], 6: "\u00e9".encode()[1:]}[token]

    from runtime.llm.sampling import SamplingParams

    seq = Decoding([7, 8], SamplingParams(max_tokens=10, stop=("END",), seed=1), 64)
    pieces = [seq.accept(t, Vocab()) for t in (1, 2, 5, 6, 3, 4)]
    assert "".join(p for p, _ in pieces) + seq.finish() == "Hello\u00e9 "
    assert pieces[-1][1] and seq.reason == "stop" and seq.out == 6
