"""Which llama.cpp pre-tokenizer a byte-level BPE ``tokenizer.json`` needs, found by behaviour.

llama.cpp re-implements each model family's pre-tokenizer (the regex split
before BPE) and names it in ``tokenizer.ggml.pre``. Its own converter
(convert_hf_to_gguf.py, ``get_vocab_base_pre``) identifies a tokenizer by what it
does, not by how tokenizer.json spells it: the sha256 of ``str(ids)`` for the
ids the tokenizer gives for a fixed check text (:data:`CHECK_TEXT`), looked up
in a table of known tokenizers (:data:`KNOWN_HASHES`, the part of llama.cpp's
table whose families run on the architectures we convert).

The ids come from the checkpoint's own ``tokenizer.json`` through the
``tokenizers`` library, as transformers' fast tokenizers computed them when
llama.cpp built its table; not from today's ``AutoTokenizer``, whose tokenizer
classes rebuild parts of the pipeline differently from one transformers
version to the next.

A vocabulary outside the table (a retrained BPE, or a checkpoint whose
tokenizer.json a transformers version rewrote) is identified by the same text
without its vocabulary: the checkpoint's normalizer and pre-tokenizer must
split the check text exactly as one of llama.cpp's pre-tokenizers does, re-run
here from the regexes in llama.cpp's ``llama-vocab.cpp`` (:data:`LLAMA_CPP_SPLITS`).
Anything else is refused rather than tokenized differently from the reference.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

from runtime.errors import BadInput, missing

log = logging.getLogger(__name__)

# llama.cpp's check text (convert_hf_to_gguf.py / convert_hf_to_gguf_update.py), escaped to ASCII.
CHECK_TEXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n\U0001f680 (normal) \U0001f636\u200d\U0001f32b\ufe0f"
    " (multiple emojis concatenated) \u2705 \U0001f999\U0001f999 3 33 333 3333 33333 333333 3333333 33333333"
    " 3.3 3..3 3...3 \u1780\u17b6\u1793\u17cb\u178f\u17c2\u1796\u17b7\u179f\u17c1\u179f\u17a2\u17b6\u1785\U0001f601"
    " ?\u6211\u60f3\u5728apple\u5de5\u4f5c1314151\u5929\uff5e ------======= \u043d\u0435\u0449\u043e \u043d\u0430"
    " \u0411\u044a\u043b\u0433\u0430\u0440\u0441\u043a\u0438 ''''''```````\"\"\"\"......!!!!!!?????? I've been"
    " 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL"
)

# sha256(str(ids of CHECK_TEXT)) -> llama.cpp pre-tokenizer name, from llama.cpp's table (the
# llama-cpp-python 0.3.36 release), for tokenizers of families on Llama and Qwen2 architectures.
KNOWN_HASHES = {
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",  # Meta-Llama-3-8B
    "c136ed14d01c2745d4f60a9596ae66800e2b61fa45643e72436041855ad4089d": "smaug-bpe",  # Smaug-Llama-3-70B
    "9d032fcbd5501f4a38150912590928bfb36091efb5df11b8e2124b0390e3fb1e": "falcon3",  # Falcon3-7B-Base
    "049ecf7629871e3041641907f3de7c733e4dbfdc736f57d882ba0b0845599754": "deepseek-llm",  # deepseek-llm-7b-base
    "347715f544604f9118bb75ed199f68779f423cabb20db6de6f31b908d04d7821": "deepseek-coder",  # deepseek-coder-6.7b
    "d4c8f286ea6b520b3d495c4455483cfa2302c0cfcd4be05d781b6a8a0a7cdaf1": "megrez",  # Megrez-3B-Instruct
    "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249": "smollm",  # SmolLM / SmolLM2
    "3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454": "gpt-2",  # openai-community/gpt2
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",  # Qwen1.5 / Qwen2 / Qwen2.5
    "d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c": "qwen2",  # Qwen3-Embedding-0.6B
    "b3f499bb4255f8ca19fccd664443283318f2fd2414d5e0b040fbdd0cc195d6c5": "deepseek-r1-qwen",  # R1-Distill-Qwen
}

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# llama.cpp pre-tokenizer name -> its regexes, applied one after the other (llama-vocab.cpp), then GPT-2's
# byte-to-unicode mapping. Only names whose split is all llama.cpp does (no extra rules in code).
LLAMA_CPP_SPLITS: dict[str, tuple[str, ...]] = {
    "gpt-2": (_GPT2,),
    "smollm": (r"\p{N}", _GPT2),
    "llama-bpe": (_LLAMA3,),
    "qwen2": (_QWEN2,),
}


def check_hash(ids: list[int]) -> str:
    """llama.cpp's identifier of a tokenizer: sha256 of the Python repr of its ids for CHECK_TEXT."""
    return hashlib.sha256(str(ids).encode()).hexdigest()


def tokenizers_module():
    try:
        import tokenizers
    except ImportError as exc:
        raise missing("tokenizers", "convert") from exc
    return tokenizers


def pre_tokenizer_pieces(tok: Any, text: str) -> list[str]:
    """What a ``tokenizers.Tokenizer``'s normalizer and pre-tokenizer make of ``text``, before the model."""
    if tok.normalizer is not None:
        text = tok.normalizer.normalize_str(text)
    if tok.pre_tokenizer is None:
        return [text]
    return [piece for piece, _ in tok.pre_tokenizer.pre_tokenize_str(text)]


def reference_pieces(name: str, text: str = CHECK_TEXT) -> list[str]:
    """llama.cpp's split of ``text`` for pre-tokenizer ``name``, in GPT-2's byte-level alphabet."""
    tk = tokenizers_module()
    pre = tk.pre_tokenizers
    steps = [pre.Split(tk.Regex(r), behavior="isolated") for r in LLAMA_CPP_SPLITS[name]]
    seq = pre.Sequence([*steps, pre.ByteLevel(add_prefix_space=False, use_regex=False)])
    return [piece for piece, _ in seq.pre_tokenize_str(text)]


def pre_tokenizer_name(tokenizer_json: Path) -> str:
    """The llama.cpp ``tokenizer.ggml.pre`` for a byte-level BPE tokenizer.json; BadInput if none fits."""
    tk = tokenizers_module()
    try:
        tok = tk.Tokenizer.from_file(str(tokenizer_json))
        ids = tok.encode(CHECK_TEXT).ids
    except Exception as exc:  # the tokenizers library raises a bare Exception on bad files
        raise BadInput(f"{tokenizer_json}: the tokenizers library cannot load it ({exc})"[:300]) from None
    digest = check_hash(ids)
    name = KNOWN_HASHES.get(digest)
    if name is not None:
        log.info("pre-tokenizer %s (check-text hash %s… in llama.cpp's table)", name, digest[:12])
        return name
    pieces = pre_tokenizer_pieces(tok, CHECK_TEXT)
    for name in LLAMA_CPP_SPLITS:
        if pieces == reference_pieces(name):
            log.info("pre-tokenizer %s (check-text hash %s… not in the table; its split of the check text"
                     " is llama.cpp's %s split)", name, digest[:12], name)
            return name
    raise BadInput(f"{tokenizer_json}: the pre-tokenizer is not one llama.cpp implements here: its check-text hash"
                   f" {digest[:12]}… is not in llama.cpp's table and its split of the check text matches none of"
                   f" {', '.join(LLAMA_CPP_SPLITS)}")
