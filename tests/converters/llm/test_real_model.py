"""End to end on a real checkpoint: SmolLM2-135M-Instruct, derived offline from its packaged GGUF.

scripts/derive_hf_checkpoint.py turns the packaged GGUF into a Hugging Face
folder (transformers dequantizes it); we convert that folder like any
checkpoint and check that ``edgerun run`` answers with the bundle and that the
report carries measured numbers within the default gates. The "as-saved" folder
is exactly what transformers 5 wrote (a byte-level pre-tokenizer without
SmolLM's digit split, byte_fallback set, the template in chat_template.jinja);
the "normalized" one has the derive script's rewrites. Both must convert alike.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from apps.cli import main as cli
from runtime.bundle.manifest import read_manifest_dir

ROOT = Path(__file__).resolve().parents[3]


def derive_script():
    spec = importlib.util.spec_from_file_location("derive_hf_checkpoint", ROOT / "scripts" / "derive_hf_checkpoint.py")
    derive = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(derive)  # type: ignore[union-attr]
    return derive


@pytest.fixture(scope="module")
def smollm_hf(smollm, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return derive_script().derive(str(smollm.path()), tmp_path_factory.mktemp("hf") / "smollm2-135m-instruct")


@pytest.fixture(scope="module")
def smollm_hf_as_saved(smollm, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return derive_script().derive(str(smollm.path()), tmp_path_factory.mktemp("hf") / "smollm2-as-saved", as_saved=True)


@pytest.mark.slow
@pytest.mark.parametrize("quant,folder", [("q8_0", "smollm_hf"), ("q4_k_m", "smollm_hf_as_saved")])
def test_real_checkpoint_converts_runs_and_reports(quant, folder, request, tmp_path: Path, capsys) -> None:
    ckpt = request.getfixturevalue(folder)
    out = tmp_path / "bundle"
    assert cli(["convert", "llm", str(ckpt), "--quant", quant, "--out", str(out), "--license", "Apache-2.0"]) == 0
    capsys.readouterr()
    quality = read_manifest_dir(out).reports["quality"]
    assert quality["passed"] and quality["tokens"] > 500
    assert 0 < quality["kl_mean"] <= quality["max_kl"] and quality["kl_p99"] >= quality["kl_mean"]
    assert quality["ppl_quant"] == pytest.approx(quality["ppl_f16"], rel=0.3)  # same model, a little noisier
    assert cli(["run", str(out), "--chat", "--prompt", "Name a colour.", "--max-tokens", "12", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["tokens_out"] > 0 and result["text"].strip()


@pytest.mark.slow
@pytest.mark.parametrize("folder", ["smollm_hf", "smollm_hf_as_saved"])
def test_real_tokenizer_ids_match_hf(folder, request, tmp_path: Path) -> None:
    # SmolLM2's 49k-token BPE, on the multilingual parity text. Its merges build no multi-digit token, so the
    # as-saved pre-tokenizer (no digit split) gives SmolLM's ids: llama.cpp's check-text hash says "smollm"
    # for both folders, as for the original checkpoint (the structure of tokenizer.json said "gpt2").
    smollm_hf = request.getfixturevalue(folder)
    from llama_cpp import Llama
    from transformers import AutoTokenizer

    from converters.llm.checkpoint import HFCheckpoint
    from converters.llm.gguf_export import write_gguf
    from converters.llm.options import Quant
    from tests.converters.llm.tiny import CORPUS, TEST_TEXT

    text = TEST_TEXT + "\n" + "\n".join(CORPUS)
    out = tmp_path / "f16.gguf"
    with HFCheckpoint.open(smollm_hf) as ckpt:
        write_gguf(ckpt, ckpt.vocab(), out, Quant.F16, name="smollm2")
    llm = Llama(str(out), vocab_only=True, verbose=False)
    try:
        ours = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
        assert llm.metadata["tokenizer.ggml.pre"] == "smollm"
    finally:
        llm.close()
    assert ours == AutoTokenizer.from_pretrained(smollm_hf).encode(text, add_special_tokens=False)
