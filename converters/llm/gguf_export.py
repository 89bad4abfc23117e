"""Write a checked Hugging Face checkpoint as an F32 or F16 GGUF, one tensor at a time.

The header (metadata and every tensor's name, shape and type) is written
first from the safetensors headers alone; then each tensor is read, put in
llama.cpp's layout, checked for NaN/Inf, cast and written, and dropped before
the next is read: peak memory is one tensor (plus the tokenizer), not the model.
Tensor names come from gguf's ``TensorNameMap`` for the architecture.
"""

from __future__ import annotations

import logging
from pathlib import Path

import gguf
import numpy as np

from converters.llm.architectures import add_hparams, rope_freqs
from converters.llm.checkpoint import HFCheckpoint
from converters.llm.options import Quant
from converters.llm.progress import Progress
from converters.llm.vocab import Vocab
from runtime.errors import BadInput

log = logging.getLogger(__name__)


def _gguf_name(tmap: gguf.TensorNameMap, hf_name: str) -> str:
    name = tmap.get_name(hf_name, try_suffixes=(".weight", ".bias"))
    if name is None:
        raise BadInput(f"tensor {hf_name!r} has no GGUF name in gguf's TensorNameMap")
    return name


def _out_dtype(quant: Quant, shape: tuple[int, ...]) -> np.dtype:
    # llama.cpp keeps norms and biases (1-D) in F32 whatever the weight type.
    return np.dtype(np.float16) if quant == Quant.F16 and len(shape) >= 2 else np.dtype(np.float32)


def write_gguf(ckpt: HFCheckpoint, vocab: Vocab, out: Path, quant: Quant, *, name: str,
               progress: bool | None = None) -> None:
    if quant not in (Quant.F32, Quant.F16):
        raise BadInput(f"write_gguf writes f32 or f16, not {quant.value}; quantize the F16 file afterwards")
    arch, hp = ckpt.arch, ckpt.hp
    tmap = gguf.get_tensor_name_map(arch.gguf_arch, hp.layers)
    w = gguf.GGUFWriter(out, arch.name)
    try:
        w.add_name(name)
        w.add_file_type(quant.ftype)
        add_hparams(w, arch, hp)
        vocab.add_to(w)
        plan: list[tuple[str, str, tuple[int, ...], np.dtype]] = []  # (hf, gguf, shape, dtype)
        freqs = rope_freqs(hp)
        if freqs is not None:
            plan.append(("", gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", freqs.shape, np.dtype(np.float32)))
        for hf in ckpt.names():
            shape = ckpt.refs[hf][1].shape
            plan.append((hf, _gguf_name(tmap, hf), shape, _out_dtype(quant, shape)))
        for _, gname, shape, dtype in plan:
            w.add_tensor_info(gname, shape, dtype, int(np.prod(shape)) * dtype.itemsize)
        w.write_header_to_file(out)
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        dtypes = {hf: dtype for hf, _, _, dtype in plan}
        with Progress("tensors", len(plan), enabled=progress) as bar:
            if freqs is not None:
                w.write_tensor_data(freqs)
                bar.advance()
            for hf, tensor in ckpt.tensors():
                w.write_tensor_data(np.ascontiguousarray(tensor.astype(dtypes[hf], copy=False)))
                del tensor
                bar.advance()
        w.close()
    except BaseException:
        if w.fout is not None:
            for f in w.fout:
                f.close()
        raise
    log.info("wrote %s (%s, %d tensors)", out, quant.value, len(plan))
