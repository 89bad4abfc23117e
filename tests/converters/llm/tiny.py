"""Tiny random Hugging Face checkpoints and BPE tokenizers, generated offline in seconds.

Each ``TinySpec`` is one architecture/tokenizer layout the converter must get
right. The tokenizer is a byte-level BPE trained with ``tokenizers`` on
:data:`CORPUS`; the model is a transformers model with random weights
(norms randomized too, so that a dropped or misplaced norm shows in the logits).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The pre-tokenizer regexes as Llama 3 and Qwen2 ship them in tokenizer.json (llama.cpp runs adapted forms).
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's 12:45 and we've got 3,000 tokens left!",
    "Der schnelle braune Fuchs springt über den faulen Hund. Größe, Straße, Äpfel und Öl.",
    "Le renard brun rapide saute par-dessus le chien paresseux. Où est l'hôtel ? À bientôt.",
    "Быстрая коричневая лиса прыгает через ленивую собаку. Съешь ещё этих мягких булок.",
    "敏捷的棕色狐狸跳过了懒狗。我们今天在山上看到了很多鸟。",
    "素早い茶色の狐がのろまな犬を飛び越える。東京は今日晴れです。",
    "الثعلب البني السريع يقفز فوق الكلب الكسول.",
    "def f(x):\n    return x ** 2  # square\n\n\tindent\r\nwindows line",
    "Emoji 🙂🚀 and symbols ©®™ — “quotes” … 1234567890 0.5 1e-3",
]
TEST_TEXT = ("Hello world! Größe 42, naïve café. Привет, мир. 你好，世界。こんにちは 🙂\n"
             "  two  spaces\tand tab; it's 2026-12-02, x=3.14159 (approx).")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@dataclass(frozen=True)
class TinySpec:
    id: str
    model_class: str  # transformers class
    pre: str  # llama.cpp pre-tokenizer name the tokenizer is built to match
    config: dict[str, Any] = field(default_factory=dict)
    pad_vocab: int = 0  # embedding rows beyond the tokenizer (padded vocabularies)
    json_only: bool = False  # SentencePiece: keep only what transformers 5 re-saves (tokenizer.json, no tokenizer.model)


SPECS = [
    # SmolLM2 layout: tied embeddings, grouped-query attention, digits split one by one.
    TinySpec("llama-smollm", "LlamaForCausalLM", "smollm", {"tie_word_embeddings": True}),
    # A plain byte-level pre-tokenizer (GPT-2's regex): llama.cpp calls it gpt-2.
    TinySpec("llama-gpt2", "LlamaForCausalLM", "gpt-2", {"tie_word_embeddings": True}),
    # Llama 3.x layout: llama3 rope scaling (rope_freqs tensor), untied head, padded vocabulary.
    TinySpec("llama3", "LlamaForCausalLM", "llama-bpe", {
        "tie_word_embeddings": False, "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 16}}, pad_vocab=13),
    # Qwen2 layout: q/k/v biases, NEOX rope (no permutation), Qwen's digit-by-digit regex.
    TinySpec("qwen2", "Qwen2ForCausalLM", "qwen2", {"tie_word_embeddings": True}),
    # Llama 2 / TinyLlama layout: SentencePiece tokenizer.model with byte fallback, full multi-head attention.
    TinySpec("llama-spm", "LlamaForCausalLM", "spm", {"tie_word_embeddings": False, "num_key_value_heads": 4}),
    # Gemma 3 text layout: 6 layers (5 sliding-window + 1 global, window 16 < the 120-token test text),
    # q/k norms, pre/post FFN norms, norm weights + 1, SentencePiece without a space prefix.
    TinySpec("gemma3", "Gemma3ForCausalLM", "spm-gemma", {
        "num_hidden_layers": 6, "head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 16,
        "rope_theta": 1000000.0}),
    # The same two SentencePiece layouts as transformers 5 re-saves them: tokenizer.json only (byte-fallback BPE;
    # Gemma: Replace normalizer, no space prefix; Llama: Metaspace pre-tokenizer with a space prefix).
    TinySpec("gemma3-json", "Gemma3ForCausalLM", "spm-gemma", {
        "num_hidden_layers": 6, "head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 16,
        "rope_theta": 1000000.0}, json_only=True),
    TinySpec("llama-spm-json", "LlamaForCausalLM", "spm", {"tie_word_embeddings": False, "num_key_value_heads": 4},
             json_only=True),
]


def build_sentencepiece(out: Path, vocab_size: int = 700, gemma: bool = False, json_only: bool = False) -> Any:
    """Train a Llama- or Gemma-style SentencePiece BPE (byte fallback, split digits); save tokenizer.model and HF files.

    ``json_only``: then load it with AutoTokenizer and save it again, as a transformers 5 user would have it
    (tokenizer.json without tokenizer.model).
    """
    import io
    import json

    import sentencepiece as spm
    from transformers import AutoTokenizer

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 4), model_writer=buf, vocab_size=vocab_size, model_type="bpe", byte_fallback=True,
        character_coverage=1.0, split_digits=True, add_dummy_prefix=not gemma,
        **(dict(pad_id=0, eos_id=1, bos_id=2, unk_id=3) if gemma else dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1)),
        normalization_rule_name="identity", remove_extra_whitespaces=False, hard_vocab_limit=False,
        allow_whitespace_only_pieces=True, minloglevel=2)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.model").write_bytes(buf.getvalue())
    names = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    if gemma:
        names |= {"pad_token": "<pad>"}
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GemmaTokenizer" if gemma else "LlamaTokenizer", **names, "add_bos_token": True, "legacy": False}))
    tok = AutoTokenizer.from_pretrained(out)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)  # writes tokenizer.json too; tokenizer.model stays, as in real Llama 2 checkpoints
    if json_only:
        tok = AutoTokenizer.from_pretrained(out)
        for p in out.iterdir():
            p.unlink()
        tok.save_pretrained(out)
        assert not (out / "tokenizer.model").exists()
    return tok


def hf_pre_tokenizer(pre: str) -> Any:
    """The pre-tokenizer for llama.cpp's ``pre`` as the family's tokenizer.json writes it (tokenizers objects)."""
    from tokenizers import Regex, pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=pre in ("gpt-2", "smollm"))
    steps = {
        "gpt-2": [byte_level],
        "smollm": [pre_tokenizers.Digits(individual_digits=True), byte_level],
        "llama-bpe": [pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated"), byte_level],
        "qwen2": [pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated"), byte_level],
        "whitespace": [pre_tokenizers.Whitespace()],  # not a llama.cpp pre-tokenizer: must be refused
    }[pre]
    return pre_tokenizers.Sequence(steps) if len(steps) > 1 else steps[0]


def build_tokenizer(pre: str, out: Path, vocab_size: int = 700, json_only: bool = False) -> Any:
    """Train a byte-level BPE whose pre-tokenizer is the HF form of llama.cpp's ``pre``; save to ``out``."""
    if pre in ("spm", "spm-gemma"):
        return build_sentencepiece(out, vocab_size, gemma=pre == "spm-gemma", json_only=json_only)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = hf_pre_tokenizer(pre)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   unk_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def build_checkpoint(spec: TinySpec, out: Path, seed: int = 0) -> tuple[Any, Any]:
    """Write a random checkpoint + tokenizer to ``out``; returns (model, tokenizer) in float32."""
    import torch
    import transformers

    tok = build_tokenizer(spec.pre, out, json_only=spec.json_only)
    torch.manual_seed(seed)
    config_name = {"Gemma3ForCausalLM": "Gemma3TextConfig"}.get(spec.model_class, spec.model_class.replace("ForCausalLM", "Config"))
    cfg_cls = getattr(transformers, config_name)
    base = dict(
        vocab_size=len(tok) + spec.pad_vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
        initializer_range=0.08, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, attn_implementation="eager",
    )
    config = cfg_cls(**{**base, **spec.config})
    model = getattr(transformers, spec.model_class)(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
    model.save_pretrained(out)
    return model, tok
