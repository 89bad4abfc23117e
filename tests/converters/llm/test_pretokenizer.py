"""The pre-tokenizer names the converter writes are names the pinned llama.cpp loads.

Every name in the hash table and in the split table is written into a tiny
byte-level GGUF and loaded ``vocab_only`` by llama-cpp-python, through the same
check the converter runs before publishing. llama.cpp's split regexes, re-run
here, must split like the tokenizer.json forms the families ship.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from converters.llm.loadcheck import check_loads
from converters.llm.pretokenizer import CHECK_TEXT, KNOWN_HASHES, LLAMA_CPP_SPLITS, reference_pieces
from runtime.errors import BackendError
from tests.converters.llm.tiny import CORPUS, TEST_TEXT, hf_pre_tokenizer

NAMES = sorted(set(KNOWN_HASHES.values()) | set(LLAMA_CPP_SPLITS))


def _byte_level_gguf(path: Path, pre: str) -> Path:
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_embedding_length(8)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_context_length(64)
    w.add_feed_forward_length(16)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(["a", "b", "ab", "<s>"])
    w.add_token_types([1, 1, 1, 3])
    w.add_token_merges(["a b"])
    w.add_bos_token_id(3)
    w.add_eos_token_id(3)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("name", NAMES)
def test_every_name_we_write_loads_in_the_pinned_llama_cpp(name: str, tmp_path: Path) -> None:
    check_loads(_byte_level_gguf(tmp_path / "v.gguf", name))


@pytest.mark.parametrize("name", ["gpt2", "llama3-bpe"])
def test_a_name_llama_cpp_does_not_know_is_refused_with_its_reason(name: str, tmp_path: Path) -> None:
    # The control for the test above: the check sees llama.cpp's refusal and says why in one line.
    with pytest.raises(BackendError, match=f"unknown pre-tokenizer type: '{name}'"):
        check_loads(_byte_level_gguf(tmp_path / "v.gguf", name))


@pytest.mark.parametrize("name", sorted(LLAMA_CPP_SPLITS))
@pytest.mark.parametrize("text", [CHECK_TEXT, TEST_TEXT, *CORPUS], ids=lambda t: t[:12])
def test_llama_cpp_splits_equal_the_families_own(name: str, text: str) -> None:
    # llama.cpp runs adapted regexes (no (?i:...)); on these texts they split as the tokenizer.json forms do.
    assert reference_pieces(name, text) == [p for p, _ in hf_pre_tokenizer(name).pre_tokenize_str(text)]


def test_the_splits_tell_the_families_apart() -> None:
    # Otherwise the first name in the table would claim every tokenizer.
    pieces = {name: tuple(reference_pieces(name)) for name in LLAMA_CPP_SPLITS}
    assert len(set(pieces.values())) == len(pieces)
