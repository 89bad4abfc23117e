"""Make a draft model for self-speculation: the target's own GGUF, requantized lower by llama.cpp.

``llama_model_quantize`` with ``allow_requantize`` takes an already quantized GGUF (the default bundle's Q4_1)
as well as an F16 one. The token embedding and output matrices are quantized to the same type as the rest
(llama.cpp would otherwise keep them at q6_K/q8_0): in a small model they are a third of the bytes each token
reads, and a draft is there to be cheap, not exact; the target checks every token it proposes. The draft keeps
the target's vocabulary and tokenizer metadata unchanged, which runtime/llm/draft.py checks when it is attached::

    edgerun convert draft default --out smollm2-draft-q4_0.gguf      # a file, attached with --draft
    edgerun run default --draft smollm2-draft-q4_0.gguf --prompt "..."
    edgerun convert draft default --out smollm2-with-draft           # a bundle that carries its draft (llm.draft)
    edgerun run ./smollm2-with-draft --prompt "..."
"""

from __future__ import annotations

import ctypes
import logging
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from converters.llm.native_log import native_output_to_log
from converters.llm.options import Quant
from runtime.errors import BackendError, BadInput, missing

if TYPE_CHECKING:
    from runtime.bundle.resolve import ResolvedModel

log = logging.getLogger(__name__)

# ggml_type of each draft weight type, used for the embedding and output matrices too (ggml.h).
DRAFT_TYPES = {Quant.Q4_0: 2, Quant.Q8_0: 8}
DRAFT_FILE = "draft.gguf"  # its name inside a bundle that carries its draft


@dataclass(frozen=True)
class Draft:
    path: Path
    quant: Quant
    target_bytes: int  # file sizes
    draft_bytes: int


def make_draft(target: Path, out: Path, quant: Quant = Quant.Q4_0, *, threads: int = 2) -> Draft:
    """Write ``out``, the GGUF ``target`` requantized to ``quant`` (embedding and output matrices included)."""
    if quant not in DRAFT_TYPES:
        raise BadInput(f"a draft cannot be made as {quant.value!r}: valid: {', '.join(q.value for q in DRAFT_TYPES)}"
                       " (q4_0: the cheapest type llama.cpp's CPU kernels run fast)")
    if out.suffix != ".gguf":
        raise BadInput(f"--out {out} must name a .gguf file (the draft is attached with --draft {out.with_suffix('.gguf')})")
    if out.exists() and out.resolve() == target.resolve():
        raise BadInput(f"--out {out} is the target itself: give another file")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        from runtime.backends.llamacpp import llama_cpp  # imported the one way the backend imports it
    except ImportError as exc:  # pragma: no cover - the llm extra is missing
        raise missing("llama_cpp", "llm") from exc
    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = threads
    params.ftype = quant.ftype
    params.allow_requantize = True
    params.token_embedding_type = DRAFT_TYPES[quant]
    params.output_tensor_type = DRAFT_TYPES[quant]
    partial = out.with_name(out.name + ".partial")
    with native_output_to_log():
        status = int(llama_cpp.llama_model_quantize(str(target).encode(), str(partial).encode(), ctypes.byref(params)))
    if status != 0:
        partial.unlink(missing_ok=True)
        raise BackendError(f"llama.cpp could not requantize {target} to {quant.value} (status {status})")
    partial.replace(out)  # never a half-written draft under the name asked for
    made = Draft(out, quant, target.stat().st_size, out.stat().st_size)
    log.info("draft %s: %s, %d bytes (target %d)", out, quant.value, made.draft_bytes, made.target_bytes)
    return made


def bundle_with_draft(model: ResolvedModel, out: Path, quant: Quant = Quant.Q4_0, *, threads: int = 2) -> Path:
    """Write the bundle directory ``out``: ``model``'s files, its draft (:func:`make_draft`) as ``draft.gguf``, and
    a manifest naming it in ``llm.draft`` (version ``<version>+draft-<quant>``), so that loading the bundle loads the
    draft too. ``out`` must not exist; nothing is left under its name if any step fails."""
    from runtime.bundle.manifest import MANIFEST, FileEntry
    from runtime.files import sha256_file

    manifest = model.manifest
    if manifest.llm is None:
        raise BadInput(f"{manifest.ref} has no llm section: a draft is made for a GGUF language model")
    if any(f.path == DRAFT_FILE for f in manifest.files):
        raise BadInput(f"{manifest.ref} already holds a file named {DRAFT_FILE}: give --out a .gguf file instead")
    if out.exists():
        raise BadInput(f"--out {out} exists: give a new directory for the bundle (or a .gguf file for the draft alone)")
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        with model.opened(*(f.path for f in manifest.files)) as paths:  # the files that were verified
            for entry, path in zip(manifest.files, paths, strict=True):
                shutil.copyfile(path, staging / entry.path)
            made = make_draft(paths[[f.role for f in manifest.files].index("weights")], staging / DRAFT_FILE, quant,
                              threads=threads)
        digest, size = sha256_file(made.path)
        version = f"{manifest.version}+draft-{quant.value}"[:64]
        bundled = replace(manifest, version=version, files=(*manifest.files, FileEntry(DRAFT_FILE, digest, size, "draft")),
                          llm=replace(manifest.llm, draft=DRAFT_FILE))
        (staging / MANIFEST).write_bytes(bundled.to_json())
        staging.replace(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info("bundle %s: %s with its %s draft", out, bundled.ref, quant.value)
    return out
