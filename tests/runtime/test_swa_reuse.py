"""A sliding-window model's cache cut back further than its window is started over, not continued.

Gemma 3's sliding-window layers free the cells that fell out of their 512-position window as a sequence grows.
llama.cpp still reports success when a tail is cut back to a position whose window those freed cells were, and the
next tokens would attend to an empty window: different text, no error. The backend reports such a cut as refused
(runtime.backends.llamacpp.tail_kept), and the KV cache starts over.
"""

from __future__ import annotations

import pytest

from runtime.llm.model import LLM
from runtime.llm.sampling import SamplingParams

GiB = 1 << 30


@pytest.mark.slow
def test_a_prompt_sharing_only_the_start_of_a_long_context_gets_the_text_a_fresh_cache_gives(gemma) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=24, seed=1)
    with LLM.load(gemma, memory=GiB, ctx=2048, threads=2, prefix_cache_bytes=0, speculate=False) as llm:
        head = llm.tokenize("Field notes on the old bridges of the valley, written by the county surveyor.")
        body = " ".join(f"Bridge {i} crosses the river at mile {i * 3} and is built of {('stone', 'iron', 'oak')[i % 3]}."
                        for i in range(110))
        other = "The surveyor's last entry is about the ferry that ran before any bridge stood. It says"
        first = head + llm.backend.tokenize(" " + body, add_bos=False, special=False)
        second = head + llm.backend.tokenize(" " + other, add_bos=False, special=False)
        assert len(first) > 1100 and len(head) < 100  # far past the 512-position window before the cut

        llm.generate(first, params)
        reused = llm.generate(second, params)
        llm.kv.clear()
        fresh = llm.generate(second, params)

    assert reused.text == fresh.text
    assert reused.reused_tokens == 0, "the cut-back cache was continued although its window was gone"


@pytest.mark.slow
def test_a_cut_within_the_window_is_kept(gemma) -> None:
    """Rejected draft cells and prompts that diverge near the end cut back less than a window: kept, not redone."""
    params = SamplingParams(temperature=0.0, max_tokens=8, seed=1)
    with LLM.load(gemma, memory=GiB, ctx=2048, threads=2, prefix_cache_bytes=0, speculate=False) as llm:
        text = " ".join(f"Line {i} of the ledger records {i * 7} sacks of grain." for i in range(100))
        first = llm.tokenize(text + " The total is")
        second = first[:-40] + llm.backend.tokenize(" In all, the ledger shows", add_bos=False, special=False)
        llm.generate(first, params)
        reused = llm.generate(second, params)
    assert reused.reused_tokens == len(first) - 40
