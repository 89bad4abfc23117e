"""The decoder architectures the converter knows, as data.

Each entry says which GGUF architecture a ``config.json`` ``architectures[0]``
becomes, whether q/k rows must be permuted (llama.cpp applies rotary embeddings
to interleaved pairs; HF Llama checkpoints store them as two halves; Qwen2 and
Gemma 3 use llama.cpp's NEOX rope and need no permutation), and which
hyper-parameters are written. Tensor names come from gguf's own ``TensorNameMap``.

Gemma 3 (text-only ``Gemma3ForCausalLM``): its RMSNorm multiplies by
``1 + weight``, llama.cpp's by ``weight``, so norm weights are shifted by one;
llama.cpp fixes some of its settings in code (every 6th layer global, local
rope base 10000, attention scale 1/sqrt(head_dim) below 27B), so a config that
differs is refused instead of converted into a model that computes something else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import gguf
import numpy as np

from runtime.errors import BadInput


@dataclass(frozen=True)
class Arch:
    hf_class: str
    gguf_arch: gguf.MODEL_ARCH
    permute_qk: bool  # HF half-split rope layout -> llama.cpp interleaved layout
    qkv_bias: bool  # attention q/k/v projections carry biases
    gemma: bool = False  # Gemma 3 layout: q/k norms, pre/post FFN norms, norm weights + 1, sliding window
    spm_space_prefix: bool = True  # SentencePiece: prepend a space to the text (Gemma: no)

    @property
    def name(self) -> str:
        return gguf.MODEL_ARCH_NAMES[self.gguf_arch]


ARCHES = {
    a.hf_class: a
    for a in (
        Arch("LlamaForCausalLM", gguf.MODEL_ARCH.LLAMA, permute_qk=True, qkv_bias=False),
        Arch("Qwen2ForCausalLM", gguf.MODEL_ARCH.QWEN2, permute_qk=False, qkv_bias=True),
        Arch("Gemma3ForCausalLM", gguf.MODEL_ARCH.GEMMA3, permute_qk=False, qkv_bias=False, gemma=True,
             spm_space_prefix=False),
    )
}


def find_arch(config: dict[str, Any], where: str) -> Arch:
    names = config.get("architectures") or []
    if not isinstance(names, list) or not names:
        raise BadInput(f"{where}: config.json has no 'architectures' list; supported: {', '.join(ARCHES)}")
    arch = ARCHES.get(names[0])
    if arch is None:
        raise BadInput(f"{where}: architecture {names[0]!r} is not supported; supported: {', '.join(ARCHES)}")
    return arch


@dataclass(frozen=True)
class HParams:
    """The numbers of config.json that shape the tensors and the GGUF metadata."""

    vocab_size: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    context_length: int
    rms_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any]
    tie_embeddings: bool
    sliding_window: int = 0  # tokens; 0: none
    layer_types: tuple[str, ...] = ()  # "sliding_attention" / "full_attention" per layer
    rope_local_theta: float = 10000.0  # rope base of sliding-window layers (Gemma 3)
    query_pre_attn_scalar: float = 0.0  # Gemma 3 attention scale is 1/sqrt(this)
    final_logit_softcapping: float = 0.0

    @classmethod
    def from_config(cls, c: dict[str, Any], where: str) -> HParams:
        try:
            hidden, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
            # transformers 5 moves rope settings into rope_parameters; older configs keep them at the top level.
            rope = dict(c.get("rope_parameters") or {})
            local = dict(rope.get("sliding_attention") or {})
            rope = dict(rope.get("full_attention") or rope)  # Gemma 3: one rope per layer type
            scaling = dict(c.get("rope_scaling") or {}) or {k: v for k, v in rope.items() if k != "rope_theta"}
            hp = cls(
                vocab_size=int(c["vocab_size"]),
                hidden=hidden,
                intermediate=int(c["intermediate_size"]),
                layers=int(c["num_hidden_layers"]),
                heads=heads,
                kv_heads=int(c.get("num_key_value_heads") or heads),
                head_dim=int(c.get("head_dim") or hidden // heads),
                context_length=int(c.get("max_position_embeddings") or 0),
                rms_eps=float(c.get("rms_norm_eps", 1e-6)),
                rope_theta=float(rope.get("rope_theta", c.get("rope_theta", 10000.0))),
                rope_scaling=scaling,
                tie_embeddings=bool(c.get("tie_word_embeddings", False)),
                sliding_window=int(c.get("sliding_window") or 0),
                layer_types=tuple(c.get("layer_types") or ()),
                rope_local_theta=float(local.get("rope_theta", c.get("rope_local_base_freq", 10000.0))),
                query_pre_attn_scalar=float(c.get("query_pre_attn_scalar") or 0.0),
                final_logit_softcapping=float(c.get("final_logit_softcapping") or 0.0),
            )
        except KeyError as exc:
            raise BadInput(f"{where}: config.json lacks {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise BadInput(f"{where}: config.json has a malformed value ({exc})") from None
        if min(hp.vocab_size, hp.hidden, hp.intermediate, hp.layers, hp.heads, hp.kv_heads, hp.context_length) <= 0:
            raise BadInput(f"{where}: config.json sizes must be positive: {hp}")
        if hp.heads % hp.kv_heads:
            raise BadInput(f"{where}: num_attention_heads {hp.heads} is not a multiple of num_key_value_heads {hp.kv_heads}")
        return hp

    @property
    def rope_type(self) -> str:
        return str(self.rope_scaling.get("rope_type") or self.rope_scaling.get("type") or "default")


def expected_shapes(arch: Arch, hp: HParams) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape (PyTorch order) for every tensor the architecture has."""
    q, kv = hp.heads * hp.head_dim, hp.kv_heads * hp.head_dim
    out: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (hp.vocab_size, hp.hidden),
        "model.norm.weight": (hp.hidden,),
    }
    if not hp.tie_embeddings:
        out["lm_head.weight"] = (hp.vocab_size, hp.hidden)
    for i in range(hp.layers):
        p = f"model.layers.{i}."
        out |= {
            p + "input_layernorm.weight": (hp.hidden,),
            p + "post_attention_layernorm.weight": (hp.hidden,),
            p + "self_attn.q_proj.weight": (q, hp.hidden),
            p + "self_attn.k_proj.weight": (kv, hp.hidden),
            p + "self_attn.v_proj.weight": (kv, hp.hidden),
            p + "self_attn.o_proj.weight": (hp.hidden, q),
            p + "mlp.gate_proj.weight": (hp.intermediate, hp.hidden),
            p + "mlp.up_proj.weight": (hp.intermediate, hp.hidden),
            p + "mlp.down_proj.weight": (hp.hidden, hp.intermediate),
        }
        if arch.qkv_bias:
            out |= {p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,), p + "self_attn.v_proj.bias": (kv,)}
        if arch.gemma:
            out |= {p + "self_attn.q_norm.weight": (hp.head_dim,), p + "self_attn.k_norm.weight": (hp.head_dim,),
                    p + "pre_feedforward_layernorm.weight": (hp.hidden,), p + "post_feedforward_layernorm.weight": (hp.hidden,)}
    return out


def permute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF's half-split rotary layout -> llama.cpp's interleaved one (rows of q/k, or their bias)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def transform(arch: Arch, hp: HParams, hf_name: str, w: np.ndarray) -> np.ndarray:
    if arch.gemma and hf_name.endswith("norm.weight"):
        return w + 1.0  # Gemma's RMSNorm scales by (1 + weight)
    if arch.permute_qk:
        if ".self_attn.q_proj." in hf_name:
            return permute_rope(w, hp.heads)
        if ".self_attn.k_proj." in hf_name:
            return permute_rope(w, hp.kv_heads)
    return w


def rope_freqs(hp: HParams) -> np.ndarray | None:
    """Llama 3.x "llama3" rope scaling as llama.cpp's per-dimension ``rope_freqs`` factors."""
    if hp.rope_type != "llama3":
        return None
    s = hp.rope_scaling
    factor = float(s.get("factor", 8.0))
    low, high = float(s.get("low_freq_factor", 1.0)), float(s.get("high_freq_factor", 4.0))
    old_ctx = float(s.get("original_max_position_embeddings", 8192))
    out = []
    for i in range(0, hp.head_dim, 2):
        wavelen = 2 * math.pi * hp.rope_theta ** (i / hp.head_dim)
        if wavelen < old_ctx / high:
            out.append(1.0)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


def add_hparams(w: gguf.GGUFWriter, arch: Arch, hp: HParams) -> None:
    w.add_context_length(hp.context_length)
    w.add_embedding_length(hp.hidden)
    w.add_block_count(hp.layers)
    w.add_feed_forward_length(hp.intermediate)
    w.add_head_count(hp.heads)
    w.add_head_count_kv(hp.kv_heads)
    w.add_key_length(hp.head_dim)
    w.add_value_length(hp.head_dim)
    w.add_rope_dimension_count(hp.head_dim)
    w.add_rope_freq_base(hp.rope_theta)
    w.add_layer_norm_rms_eps(hp.rms_eps)
    w.add_vocab_size(hp.vocab_size)
    if hp.rope_type == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(float(hp.rope_scaling["factor"]))
    elif hp.rope_type not in ("default", "llama3"):
        raise BadInput(f"rope scaling type {hp.rope_type!r} is not supported; supported: default, llama3, linear")
    if arch.gemma:
        _check_gemma3(hp)
        w.add_sliding_window(hp.sliding_window)
        if hp.final_logit_softcapping:
            w.add_final_logit_softcapping(hp.final_logit_softcapping)


GEMMA3_SWA_PERIOD = 6  # llama.cpp: layers 5, 11, 17, ... are global, the rest use the sliding window


def _check_gemma3(hp: HParams) -> None:
    want = tuple("full_attention" if (i + 1) % GEMMA3_SWA_PERIOD == 0 else "sliding_attention" for i in range(hp.layers))
    if hp.layer_types and hp.layer_types != want:
        raise BadInput(f"Gemma 3 layer_types {list(hp.layer_types)} differ from llama.cpp's fixed pattern (every"
                       f" {GEMMA3_SWA_PERIOD}th layer global); this checkpoint cannot be converted faithfully")
    if hp.rope_local_theta != 10000.0:
        raise BadInput(f"Gemma 3 sliding-window rope base {hp.rope_local_theta} differs from llama.cpp's fixed 10000")
    if hp.query_pre_attn_scalar and hp.query_pre_attn_scalar != hp.head_dim:
        raise BadInput(f"Gemma 3 query_pre_attn_scalar {hp.query_pre_attn_scalar} differs from head_dim {hp.head_dim};"
                       " llama.cpp scales attention by 1/sqrt(head_dim) for this size")
    if hp.sliding_window <= 0:
        raise BadInput("Gemma 3 config.json lacks sliding_window")
