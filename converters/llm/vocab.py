"""The tokenizer of a Hugging Face checkpoint, written as GGUF ``tokenizer.*`` keys.

Supported:

* SentencePiece ``tokenizer.model`` files (Llama 2, TinyLlama, Gemma: pieces,
  scores and token types through gguf's ``SentencePieceVocab``; needs the
  ``sentencepiece`` package);
* a SentencePiece vocabulary saved as ``tokenizer.json`` only (transformers 5
  writes no tokenizer.model): llama.cpp's "llama" vocabulary, types from the
  added tokens. A byte-fallback BPE (a Hub checkpoint re-saved) gets scores
  from its merge order, so llama.cpp merges as the BPE does; a byte-fallback
  Unigram (what transformers writes for a vocabulary it read from a GGUF)
  keeps its SentencePiece scores, which llama.cpp merges by, as its own
  converter does with a tokenizer.model of either kind: that reproduces the
  SentencePiece BPE the GGUF came from, not a Viterbi segmentation;
* byte-level BPE in ``tokenizer.json`` (GPT-2 style: SmolLM2, Llama 3.x,
  Qwen2/2.5), with the llama.cpp pre-tokenizer found by
  :mod:`converters.llm.pretokenizer` the way llama.cpp's converter finds it.

A text handling llama.cpp does not implement is refused rather than converted
into a model that tokenizes differently.
Merges, special token ids, add-BOS/EOS flags and the chat template come from
gguf's ``SpecialVocab``.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf

from converters.llm.pretokenizer import CHECK_TEXT, pre_tokenizer_name, pre_tokenizer_pieces, tokenizers_module
from runtime.errors import BadInput, missing

log = logging.getLogger(__name__)

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


def _read_tokenizer_json(path: Path) -> tuple[dict[str, Any], dict[str, int], dict[int, dict[str, Any]]]:
    """(the JSON, piece -> id, id -> added token) of a BPE or byte-fallback Unigram tokenizer.json."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        model = data["model"]
        kind = model.get("type")
        if kind == "BPE":
            base: dict[str, int] = {str(k): int(v) for k, v in model["vocab"].items()}
        elif kind == "Unigram" and model.get("byte_fallback"):
            # What transformers writes for a vocabulary it read from a GGUF: SentencePiece pieces and scores.
            base = {str(piece): i for i, (piece, _) in enumerate(model["vocab"])}
        else:
            raise BadInput(f"{path}: tokenizer model {kind!r} is not supported; supported: SentencePiece tokenizer.model,"
                           " BPE tokenizer.json (byte-level or SentencePiece-style), byte-fallback Unigram tokenizer.json")
        added = {int(t["id"]): t for t in data.get("added_tokens") or []}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BadInput(f"{path}: unreadable tokenizer ({type(exc).__name__}: {exc})"[:300]) from None
    return data, base, added


def _size(path: Path, vocab_size: int, base: dict[str, int], added: dict[int, Any]) -> int:
    n = max([vocab_size, *(i + 1 for i in base.values()), *(i + 1 for i in added)])
    if n > vocab_size:
        raise BadInput(f"{path}: the tokenizer has ids up to {n - 1} but config.json vocab_size is {vocab_size}")
    if min([0, *base.values(), *added]) < 0:
        raise BadInput(f"{path}: the tokenizer has a negative token id")
    return n


def _tokens(n: int, base: Iterable[tuple[str, int]], added: dict[int, dict[str, Any]]) -> tuple[list[str], list[int]]:
    """Token texts and types by id; ids no token claims are embedding rows past the tokenizer (padding)."""
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = [int(gguf.TokenType.UNUSED)] * n
    for text, i in base:
        tokens[i], types[i] = text, int(gguf.TokenType.NORMAL)
    for i, t in added.items():
        tokens[i] = str(t["content"])
        types[i] = int(gguf.TokenType.CONTROL if t.get("special") else gguf.TokenType.USER_DEFINED)
    return tokens, types


def _load_byte_level_bpe(directory: Path, path: Path, vocab_size: int, base: dict[str, int],
                         added: dict[int, dict[str, Any]]) -> Vocab:
    pre = pre_tokenizer_name(path)
    n = _size(path, vocab_size, base, added)
    tokens, types = _tokens(n, base.items(), added)
    _check_unique(path, tokens)
    special = _special(directory, n, merges=True)
    if not special.merges:
        raise BadInput(f"{path}: the BPE tokenizer has no merges")
    log.info("tokenizer: %d tokens (%d added), pre-tokenizer %s, %d merges", n, len(added), pre, len(special.merges))
    return Vocab("gpt2", tokens, types, pre, special)


_BYTE_PIECE = re.compile(r"<0x[0-9A-F]{2}>")
_SPACE = "\u2581"  # SentencePiece's visible space


def _space_prefix(tok: Any, path: Path) -> bool:
    """Whether a SentencePiece-style tokenizer.json prepends a space; refuse any other text handling.

    llama.cpp's SentencePiece tokenizer replaces spaces with U+2581 and, with
    add_space_prefix, puts one in front, and splits nothing: the checkpoint's
    normalizer and pre-tokenizer must do exactly that to the check text.
    """
    got = pre_tokenizer_pieces(tok, CHECK_TEXT)
    escaped = CHECK_TEXT.replace(" ", _SPACE)
    for prefix in (False, True):
        if got == [_SPACE * prefix + escaped]:
            return prefix
    raise BadInput(f"{path}: the normalizer/pre-tokenizer of this SentencePiece-style tokenizer does more than"
                   " llama.cpp's SentencePiece tokenizer (replace spaces with U+2581, optionally prefix one)")


def _merge_scores(path: Path, merges: list[Any], base: dict[str, int], n: int) -> list[float]:
    """Scores under which llama.cpp's SentencePiece tokenizer merges as tokenizer.json's BPE does.

    llama.cpp joins the adjacent pair whose joined text is the vocabulary token
    with the highest score (leftmost first); the BPE joins the adjacent pair that
    comes first in ``merges``. Minus the rank of the first merge that makes a
    token gives llama.cpp that order. Tokens no merge makes (characters, bytes,
    control tokens) are never a join's result in either; they get the lowest score.
    """
    scores: list[float | None] = [None] * n
    for rank, merge in enumerate(merges):
        pair = merge.split(" ") if isinstance(merge, str) else merge
        if not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(p, str) for p in pair):
            raise BadInput(f"{path}: merge #{rank} {str(merge)[:40]!r} is not a pair of pieces")
        i = base.get(pair[0] + pair[1])
        if i is None:
            raise BadInput(f"{path}: merge #{rank} makes {(pair[0] + pair[1])[:40]!r}, which is not in the vocabulary")
        if scores[i] is None:
            scores[i] = -float(rank)
    floor = -float(len(merges) + 1)
    return [floor if s is None else s for s in scores]


def _restore_byte_pieces(tokens: list[str]) -> None:
    """Put back byte pieces written as their character (transformers' GGUF import writes <0x09> as a tab).

    SentencePiece keeps the 256 byte pieces <0x00>..<0xFF> in one block of ids. A
    slot of that block holding the byte's own character, which another id also
    holds, is the byte piece: as it stands, llama.cpp would abort on the twice-used text.
    """
    first = {t: i for i, t in enumerate(tokens)}
    if "<0x00>" not in first:
        return
    counts = Counter(tokens)
    for b in range(256):
        i = first["<0x00>"] + b
        if i < len(tokens) and tokens[i] == chr(b) and counts[chr(b)] > 1 and f"<0x{b:02X}>" not in first:
            log.info("tokenizer: id %d holds %r where the byte piece <0x%02X> belongs; restored", i, chr(b), b)
            tokens[i] = f"<0x{b:02X}>"


def _check_unique(path: Path, tokens: list[str]) -> None:
    """llama.cpp maps each token text to one id and aborts the process on a text used twice."""
    counts = Counter(tokens)
    twice = [t for t, c in counts.items() if c > 1]
    if twice:
        ids = [i for i, t in enumerate(tokens) if t == twice[0]]
        raise BadInput(f"{path}: {len(twice)} token text(s) appear more than once, e.g. {twice[0][:20]!r} at ids"
                       f" {ids[:4]}; llama.cpp needs one id per text")


def _load_sentencepiece_json(directory: Path, path: Path, vocab_size: int, data: dict[str, Any], base: dict[str, int],
                             added: dict[int, dict[str, Any]]) -> Vocab:
    """A SentencePiece vocabulary saved as tokenizer.json only (Gemma 3 from transformers 5): llama.cpp's "llama" one.

    A byte-fallback BPE gets scores from its merge order; a byte-fallback Unigram (what transformers writes
    for a vocabulary it read from a GGUF) carries the SentencePiece scores, which llama.cpp's SentencePiece
    tokenizer uses as they are, as llama.cpp's converter does for a tokenizer.model of either kind.
    """
    tk = tokenizers_module()
    try:
        tok = tk.Tokenizer.from_file(str(path))
    except Exception as exc:  # the tokenizers library raises a bare Exception on bad files
        raise BadInput(f"{path}: the tokenizers library cannot load it ({exc})"[:300]) from None
    space_prefix = _space_prefix(tok, path)
    n = _size(path, vocab_size, base, added)
    model = data["model"]
    if model["type"] == "Unigram":  # by position: a GGUF-derived vocabulary can hold one text twice
        tokens, types = _tokens(n, ((str(piece), i) for i, (piece, _) in enumerate(model["vocab"])), added)
        scores = [float(score) for _, score in model["vocab"]] + [-1000.0] * (n - len(model["vocab"]))
    else:
        tokens, types = _tokens(n, base.items(), added)
        scores = _merge_scores(path, model.get("merges") or [], base, n)
    _restore_byte_pieces(tokens)
    for i, t in enumerate(tokens):
        if types[i] == gguf.TokenType.NORMAL and _BYTE_PIECE.fullmatch(t):
            types[i] = int(gguf.TokenType.BYTE)
    for i, t in added.items():
        # llama.cpp finds user-defined tokens in the raw text, before spaces become U+2581; a token the
        # tokenizer matches in normalized text is written with spaces (as llama.cpp's converter does).
        if types[i] == gguf.TokenType.USER_DEFINED and t.get("normalized", True):
            tokens[i] = tokens[i].replace(_SPACE, " ")
    unk_id = model.get("unk_id") if model["type"] == "Unigram" else base.get(model.get("unk_token"))
    if isinstance(unk_id, int) and 0 <= unk_id < n:
        types[unk_id] = int(gguf.TokenType.UNKNOWN)
    _check_unique(path, tokens)
    log.info("tokenizer: SentencePiece-style %s from tokenizer.json, %d tokens (%d added), space prefix %s",
             model["type"], n, len(added), space_prefix)
    return Vocab("llama", tokens, types, "default", _special(directory, n, merges=False), scores, space_prefix)


def load_vocab(directory: Path, vocab_size: int, *, space_prefix: bool = True) -> Vocab:
    """Read tokenizer.model or tokenizer.json (+ tokenizer_config.json); pad to ``vocab_size`` embedding rows."""
    if (directory / "tokenizer.model").is_file():
        return _load_sentencepiece(directory, vocab_size, space_prefix)
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise BadInput(f"{directory}: no tokenizer; supported: SentencePiece tokenizer.model, BPE tokenizer.json")
    data, base, added = _read_tokenizer_json(path)
    model = data["model"]
    if model["type"] == "Unigram" or (model.get("byte_fallback") and any(_BYTE_PIECE.fullmatch(t) for t in base)):
        # SentencePiece-style: characters first, bytes only as a fallback. (A byte-level BPE may carry
        # the flag too, as transformers 5 writes it, but has no byte pieces for it to use.)
        return _load_sentencepiece_json(directory, path, vocab_size, data, base, added)
    return _load_byte_level_bpe(directory, path, vocab_size, base, added)
