"""The GPU check's model: Qwen2.5-0.5B's architecture with random weights, converted by llama.cpp's own converter.

Issue 20 measured the raw library on this shape (24 layers, 896 wide, 151,936-entry vocabulary, F16: 1.27 GB), so
the check makes the same one on the GPU machine rather than carrying 1.27 GB:

    python scripts/gpu_model.py tokenizer OUT_DIR        here: the default model's (SmolLM2) tokenizer files, ~2 MB
    python scripts/gpu_model.py make --tokenizer DIR --converter convert_hf_to_gguf.py --out model.gguf [--tiny]

``make`` builds ``Qwen2ForCausalLM`` from scripts/gpu_qwen2.5-0.5b-config.json (Qwen's published config; bos/eos
set to the tokenizer's <|im_start|>/<|im_end|>) with random float16 weights, saves it with the tokenizer, and runs
the sdist's convert_hf_to_gguf.py --outtype f16. Qwen's own tokenizer cannot be fetched offline; SmolLM2's byte-level
BPE (pre-tokenizer "smollm", named as below), and the converter pads the vocabulary to the
config's 151,936 entries ([PADn] tokens), so every tensor has Qwen2.5-0.5B's shape. ``--tiny``: 2 layers, 64 wide
(the dry run here). Random weights: speed and placement are the model's, the text is noise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "gpu_qwen2.5-0.5b-config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
PRE = "smollm"  # the default model's tokenizer.ggml.pre
# llama.cpp's converter names a BPE pre-tokenizer by the hash of the ids its tokenizer gives for a check text; the
# tokenizer transformers rebuilds from the GGUF hashes differently from the Hub's SmolLM files (edgerun's converter
# names it by its regex split instead), so an unrecognised hash falls back to the GGUF's own name, and only then.
CONVERT = """
import os, runpy, sys
converter = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(converter))
import conversion.base as base
recognised = base.TextModel.get_vocab_base_pre
def pre(self, tokenizer):
    try:
        return recognised(self, tokenizer)
    except NotImplementedError:
        print("gpu_model: pre-tokenizer hash not recognised; using", os.environ["GPU_MODEL_PRE"], file=sys.stderr)
        return os.environ["GPU_MODEL_PRE"]
base.TextModel.get_vocab_base_pre = pre
runpy.run_path(converter, run_name="__main__")
"""


def write_tokenizer(out: Path) -> None:
    """SmolLM2's tokenizer as Hugging Face files, from the default bundle's GGUF (scripts/derive_hf_checkpoint.py)."""
    sys.path.insert(0, str(HERE.parent))
    sys.path.insert(0, str(HERE))
    from derive_hf_checkpoint import _gguf_path, _normalize
    from transformers import AutoTokenizer

    gguf_file = _gguf_path("default")
    out.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    tok.save_pretrained(out)
    (out / "config.json").write_text("{}\n")  # _normalize rewrites one; the model's comes from CONFIG
    _normalize(out, gguf_file)
    (out / "config.json").unlink()
    for extra in set(p.name for p in out.iterdir()) - set(TOKENIZER_FILES):
        (out / extra).unlink()
    print(f"tokenizer: {out} ({sum(p.stat().st_size for p in out.iterdir()) >> 10} KiB)")


def make(tokenizer: Path, converter: Path, out: Path, tiny: bool) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    t0 = time.monotonic()
    cfg = json.loads(CONFIG.read_text())
    if tiny:
        cfg.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_window_layers=2)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="gpu-model-") as tmp:
        hf = Path(tmp)
        (hf / "config.json").write_text(json.dumps(cfg))
        config = AutoConfig.from_pretrained(hf)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float16)
        model.save_pretrained(hf)
        for name in TOKENIZER_FILES:
            if (tokenizer / name).is_file():
                shutil.copy(tokenizer / name, hf / name)
        made = time.monotonic()
        print(f"random {config.model_type} model: {sum(p.numel() for p in model.parameters()) / 1e6:.0f} M parameters"
              f" in {made - t0:.1f} s", flush=True)
        del model
        cmd = [sys.executable, "-c", CONVERT, str(converter), str(hf), "--outtype", "f16", "--outfile", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "GPU_MODEL_PRE": PRE})
        sys.stderr.write(done.stderr[-20000:])
        if done.returncode != 0:
            raise SystemExit(f"convert_hf_to_gguf.py failed (exit {done.returncode})")
    print(f"model: {out} ({out.stat().st_size / 1e9:.2f} GB) in {time.monotonic() - t0:.1f} s"
          f" (conversion {time.monotonic() - made:.1f} s)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tokenizer")
    t.add_argument("out", type=Path)
    m = sub.add_parser("make")
    m.add_argument("--tokenizer", type=Path, required=True)
    m.add_argument("--converter", type=Path, required=True)
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--tiny", action="store_true")
    args = p.parse_args(argv)
    if args.cmd == "tokenizer":
        write_tokenizer(args.out)
    else:
        make(args.tokenizer, args.converter, args.out, args.tiny)
    return 0


if __name__ == "__main__":
    sys.exit(main())
