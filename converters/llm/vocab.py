"""The tokenizer of a Hugging Face checkpoint, written as GGUF ``tokenizer.*`` keys.

Supported: SentencePiece ``tokenizer.model`` files (Llama 2, TinyLlama: pieces,
scores and token types through gguf's ``SentencePieceVocab``; needs the
``sentencepiece`` package) and byte-level BPE tokenizers in ``tokenizer.json``
(GPT-2 style, as used by SmolLM2, Llama 3.x, Qwen2/2.5). llama.cpp re-implements each model family's
pre-tokenizer (the regex that splits text before BPE) and names it in
``tokenizer.ggml.pre``; we find that name by matching the pre-tokenizer of
tokenizer.json against :data:`PRE_TOKENIZERS`, and refuse one we do not know
rather than tokenizing differently from the reference. Merges, special token
ids, add-BOS/EOS flags and the chat template come from gguf's ``SpecialVocab``.
A BPE tokenizer.json with byte fallback but no tokenizer.model (SentencePiece
converted to JSON only) is refused.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf

from runtime.errors import BadInput, missing

log = logging.getLogger(__name__)

_GPT2_BYTELEVEL = {"type": "ByteLevel", "use_regex": True}
_BYTELEVEL_NO_REGEX = {"type": "ByteLevel", "use_regex": False}
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _split(regex: str) -> dict[str, Any]:
    return {"type": "Split", "pattern": {"Regex": regex}}


# llama.cpp pre-tokenizer name -> the tokenizer.json pre_tokenizer steps it implements
# (only the fields that change the split are compared).
PRE_TOKENIZERS: dict[str, list[dict[str, Any]]] = {
    "gpt2": [_GPT2_BYTELEVEL],
    "smollm": [{"type": "Digits", "individual_digits": True}, _GPT2_BYTELEVEL],
    "llama-bpe": [_split(LLAMA3_REGEX), _BYTELEVEL_NO_REGEX],
    "qwen2": [_split(QWEN2_REGEX), _BYTELEVEL_NO_REGEX],
}


def _steps(pre: Any) -> list[dict[str, Any]]:
    if not isinstance(pre, dict):
        return []
    if pre.get("type") == "Sequence":
        return [s for p in pre.get("pretokenizers", []) for s in _steps(p)]
    return [pre]


def _matches(step: dict[str, Any], want: dict[str, Any]) -> bool:
    return all(step.get(k, True if k == "use_regex" else None) == v for k, v in want.items())


def pre_tokenizer_name(tokenizer_json: dict[str, Any], where: str) -> str:
    steps = _steps(tokenizer_json.get("pre_tokenizer"))
    for name, want in PRE_TOKENIZERS.items():
        if len(steps) == len(want) and all(_matches(s, w) for s, w in zip(steps, want, strict=True)):
            return name
    kinds = [s.get("type") for s in steps]
    raise BadInput(f"{where}: tokenizer.json pre-tokenizer {kinds} is not one llama.cpp implements here;"
                   f" supported: {', '.join(PRE_TOKENIZERS)}")


@dataclass(frozen=True)
class Vocab:
    model: str  # tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SentencePiece)
    tokens: list[str]
    types: list[int]  # gguf.TokenType values
    pre: str  # llama.cpp pre-tokenizer name
    special: gguf.SpecialVocab
    scores: list[float] | None = None  # SentencePiece piece scores
    space_prefix: bool = True  # SentencePiece: llama.cpp prepends a space to the text

    def add_to(self, w: gguf.GGUFWriter) -> None:
        w.add_tokenizer_model(self.model)
        w.add_tokenizer_pre(self.pre)
        w.add_token_list(self.tokens)
        if self.scores is not None:
            w.add_token_scores(self.scores)
        w.add_token_types(self.types)
        if self.model == "llama" and not self.space_prefix:
            w.add_add_space_prefix(False)
        self.special.add_to_gguf(w, quiet=True)


def _special(directory: Path, n: int, merges: bool) -> gguf.SpecialVocab:
    try:
        return gguf.SpecialVocab(directory, load_merges=merges, n_vocab=n)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BadInput(f"{directory}: unreadable tokenizer_config.json/tokenizer.json ({exc})"[:300]) from None


def _load_sentencepiece(directory: Path, vocab_size: int, space_prefix: bool) -> Vocab:
    path = directory / "tokenizer.model"
    try:
        import sentencepiece  # noqa: F401  (gguf.vocab needs it; say how to get it)
    except ImportError as exc:
        raise missing("sentencepiece", "convert") from exc
    try:
        sp = gguf.vocab.SentencePieceVocab(directory)
        pieces = list(sp.all_tokens())
    except (OSError, RuntimeError, ValueError) as exc:
        raise BadInput(f"{path}: unreadable SentencePiece tokenizer.model ({exc})"[:300]) from None
    if len(pieces) > vocab_size:
        raise BadInput(f"{path}: the tokenizer has {len(pieces)} pieces but config.json vocab_size is {vocab_size}")
    tokens = [text.decode("utf-8") for text, _, _ in pieces]
    scores = [float(score) for _, score, _ in pieces]
    types = [int(t) for _, _, t in pieces]
    for i in range(len(pieces), vocab_size):  # embedding rows past the tokenizer
        tokens.append(f"[PAD{i}]")
        scores.append(-1000.0)
        types.append(int(gguf.TokenType.UNUSED))
    log.info("tokenizer: SentencePiece, %d pieces (padded to %d)", len(pieces), vocab_size)
    return Vocab("llama", tokens, types, "default", _special(directory, vocab_size, merges=False), scores, space_prefix)


def load_vocab(directory: Path, vocab_size: int, *, space_prefix: bool = True) -> Vocab:
    """Read tokenizer.model or tokenizer.json (+ tokenizer_config.json); pad to ``vocab_size`` embedding rows."""
    if (directory / "tokenizer.model").is_file():
        return _load_sentencepiece(directory, vocab_size, space_prefix)
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise BadInput(f"{directory}: no tokenizer; supported: SentencePiece tokenizer.model, byte-level BPE tokenizer.json")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        model = data["model"]
        if model.get("type") != "BPE" or model.get("byte_fallback"):
            raise BadInput(f"{path}: tokenizer model {model.get('type')!r}"
                           f"{' with byte fallback (SentencePiece-style; add its tokenizer.model)' if model.get('byte_fallback') else ''}"
                           " is not supported; supported: SentencePiece tokenizer.model, byte-level BPE tokenizer.json")
        base: dict[str, int] = model["vocab"]
        added = {int(t["id"]): t for t in data.get("added_tokens", [])}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise BadInput(f"{path}: unreadable tokenizer ({type(exc).__name__}: {exc})"[:300]) from None
    pre = pre_tokenizer_name(data, str(path))
    n = max([vocab_size, *(i + 1 for i in base.values()), *(i + 1 for i in added)])
    if n > vocab_size:
        raise BadInput(f"{path}: the tokenizer has ids up to {n - 1} but config.json vocab_size is {vocab_size}")
    tokens: list[str | None] = [None] * n
    types = [gguf.TokenType.UNUSED] * n
    for text, i in base.items():
        tokens[i], types[i] = text, gguf.TokenType.NORMAL
    for i, t in added.items():
        tokens[i] = t["content"]
        types[i] = gguf.TokenType.CONTROL if t.get("special") else gguf.TokenType.USER_DEFINED
    for i, t in enumerate(tokens):
        if t is None:  # embedding rows past the tokenizer (padded vocabularies)
            tokens[i] = f"[PAD{i}]"
    special = _special(directory, n, merges=True)
    if not special.merges:
        raise BadInput(f"{path}: the BPE tokenizer has no merges")
    log.info("tokenizer: %d tokens (%d added), pre-tokenizer %s, %d merges", n, len(added), pre, len(special.merges))
    return Vocab("gpt2", [t for t in tokens if t is not None], [int(t) for t in types], pre, special)
