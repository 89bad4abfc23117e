"""Parity with the reference implementation: llama.cpp on our F32 GGUF vs transformers on the checkpoint.

For each supported layout (tiny.SPECS) the logits over the same token ids must
agree to RTOL of the largest logit (F32 weights, F32 KV cache: what remains is
summation order; we measure < 1e-6), and llama.cpp's tokenizer, reading only
the GGUF, must give the HF tokenizer's ids on a multilingual text.

Gemma 3 uses GELU, which ggml's CPU backend evaluates through an FP16 lookup
table (input and output rounded to FP16). The reference does the same rounding
(:func:`fp16_table_gelu`); what remains over 6 layers and 120 tokens is < 4e-4
of the logit range (measured 3.6e-4), hence RTOL_GELU. Without that emulation
the gap is 2.6e-3, still 30x below a layout error (see the mutation tests).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from converters.llm import architectures
from converters.llm.checkpoint import HFCheckpoint
from converters.llm.gguf_export import write_gguf
from converters.llm.options import Quant
from tests.converters.llm.tiny import SPECS, TEST_TEXT

RTOL = 1e-4  # max |llama.cpp - transformers| / max |transformers| over all positions and tokens
RTOL_GELU = 1e-3  # models with GELU (Gemma 3): see the module docstring
GGML_TYPE_F32 = 0


def fp16_table_gelu():
    """GELU (tanh form) with FP16-rounded input and output, as ggml's CPU lookup table computes it."""
    import torch

    class Fp16TableGelu(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.gelu(x.half().float(), approximate="tanh").half().float()

    return Fp16TableGelu()


def _to_gguf(ckpt_dir: Path, out: Path) -> Path:
    with HFCheckpoint.open(ckpt_dir) as ckpt:
        write_gguf(ckpt, ckpt.vocab(), out, Quant.F32, name="tiny")
    return out


def _llama(path: Path, **kw):
    from llama_cpp import Llama

    return Llama(str(path), n_ctx=256, n_batch=256, n_ubatch=256, n_threads=2, verbose=False, **kw)


def _rel_err(ckpt_dir: Path, gguf_path: Path) -> float:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ids = AutoTokenizer.from_pretrained(ckpt_dir).encode(TEST_TEXT, add_special_tokens=False)
    model = AutoModelForCausalLM.from_pretrained(ckpt_dir, dtype=torch.float32, attn_implementation="eager").eval()
    if "gelu" in str(getattr(model.config, "hidden_activation", "")):
        for layer in model.model.layers:
            layer.mlp.act_fn = fp16_table_gelu()
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].numpy()
    llm = _llama(gguf_path, logits_all=True, type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32)
    try:
        llm.eval(ids)
        got = np.array(llm.scores[: len(ids)])
    finally:
        llm.close()
    assert got.shape == ref.shape
    return float(np.abs(got - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("spec", SPECS, ids=[s.id for s in SPECS])
def test_logits_match_transformers(spec, tiny_root: Path, tmp_path: Path) -> None:
    ckpt = tiny_root / spec.id
    err = _rel_err(ckpt, _to_gguf(ckpt, tmp_path / "tiny-f32.gguf"))
    tol = RTOL_GELU if spec.model_class.startswith("Gemma") else RTOL
    assert err < tol, f"{spec.id}: llama.cpp logits differ from transformers by {err:.2e} of the logit range"


@pytest.mark.parametrize("spec", SPECS, ids=[s.id for s in SPECS])
def test_tokenizer_ids_match_hf(spec, tiny_root: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    ckpt = tiny_root / spec.id
    tok = AutoTokenizer.from_pretrained(ckpt)
    hf = tok.encode(TEST_TEXT, add_special_tokens=False)
    llm = _llama(_to_gguf(ckpt, tmp_path / "tiny-f32.gguf"), vocab_only=True)
    try:
        ours = llm.tokenize(TEST_TEXT.encode("utf-8"), add_bos=False, special=False)
        # Special tokens, BOS and the chat template travel too.
        assert llm.tokenize(tok.eos_token.encode(), add_bos=False, special=True) == [tok.eos_token_id]
        assert llm.token_bos() == tok.bos_token_id
        assert llm.metadata.get("tokenizer.chat_template") == tok.chat_template
    finally:
        llm.close()
    assert ours == hf


def _no_norm_shift(arch, hp, name, w):
    return w if name.endswith("norm.weight") else _TRANSFORM(arch, hp, name, w)


_TRANSFORM = architectures.transform


@pytest.mark.parametrize("spec_id,target,mutant", [
    # Without the q/k permutation the Llama rope layout is wrong.
    ("llama-smollm", "permute_rope", lambda w, n_head: w),
    # Without the +1 on Gemma's norm weights every norm scales by w instead of 1 + w.
    ("gemma3", "transform", _no_norm_shift),
])
def test_parity_check_catches_a_layout_error(spec_id, target, mutant, tiny_root: Path, tmp_path: Path, monkeypatch) -> None:
    # Evidence that the logit test can fail: each mutant must land far above the tolerance.
    monkeypatch.setattr(architectures, target, mutant)
    if target == "transform":
        monkeypatch.setattr("converters.llm.checkpoint.transform", mutant)
    ckpt = tiny_root / spec_id
    assert _rel_err(ckpt, _to_gguf(ckpt, tmp_path / "wrong.gguf")) > 10 * RTOL_GELU


def test_unigram_tokenizer_json_tokenizes_like_its_tokenizer_model(tiny_copy, tmp_path: Path) -> None:
    # transformers writes a vocabulary it read from a GGUF as a byte-fallback Unigram tokenizer.json with the
    # SentencePiece scores (and no tokenizer.model). Rebuilt that way from the tiny Gemma's own tokenizer.model,
    # it must give llama.cpp the vocabulary the tokenizer.model route gives: the same ids on the test text.
    import json

    import sentencepiece as spm

    from tests.converters.llm.tiny import CORPUS

    ckpt = tiny_copy("gemma3")
    sp = spm.SentencePieceProcessor(model_file=str(ckpt / "tokenizer.model"))
    tj = json.loads((ckpt / "tokenizer.json").read_text())
    tj["model"] = {"type": "Unigram", "unk_id": sp.unk_id(), "byte_fallback": True,
                   "vocab": [[sp.id_to_piece(i), sp.get_score(i)] for i in range(sp.get_piece_size())]}
    unigram = tmp_path / "unigram"
    unigram.mkdir()
    for p in ckpt.iterdir():
        if p.name != "tokenizer.model":
            (unigram / p.name).write_bytes(p.read_bytes())
    (unigram / "tokenizer.json").write_text(json.dumps(tj))
    text = (TEST_TEXT + "\n" + "\n".join(CORPUS)).encode()
    ids = []
    for d in (ckpt, unigram):
        llm = _llama(_to_gguf(d, tmp_path / f"{d.name}.gguf"), vocab_only=True)
        try:
            ids.append(llm.tokenize(text, add_bos=True, special=False))
        finally:
            llm.close()
    assert ids[0] == ids[1]
