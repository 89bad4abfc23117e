"""Quantize an F16 GGUF with llama.cpp's own quantizer (``llama_model_quantize``).

llama.cpp offers no progress callback for quantization, so the bar follows the
size of the output file against the size the type normally produces.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from pathlib import Path

from converters.llm.native_log import native_output_to_log
from converters.llm.options import Quant
from converters.llm.progress import Progress
from runtime.errors import BackendError, BadInput, missing

log = logging.getLogger(__name__)

# Output size as a fraction of the F16 file (bits per weight / 16), for the progress bar only.
_SIZE_RATIO = {Quant.Q8_0: 8.5 / 16, Quant.Q4_0: 4.5 / 16, Quant.Q4_K_M: 4.9 / 16}


def quantize(src: Path, out: Path, quant: Quant, *, threads: int = 2, progress: bool | None = None) -> None:
    """Write ``out`` as ``src`` (an F16 GGUF) quantized to ``quant``."""
    if quant not in _SIZE_RATIO:
        raise BadInput(f"llama.cpp quantization to {quant.value!r} is not offered; valid: {', '.join(q.value for q in _SIZE_RATIO)}")
    try:
        import llama_cpp
    except ImportError as exc:
        raise missing("llama_cpp", "llm") from exc
    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = threads
    params.ftype = quant.ftype
    expected = max(int(src.stat().st_size * _SIZE_RATIO[quant]), 1)
    result: list[int] = []

    def run() -> None:
        result.append(int(llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), ctypes.byref(params))))

    worker = threading.Thread(target=run, name="llama-quantize", daemon=True)
    with native_output_to_log() as terminal, Progress("quantize", expected, enabled=progress, stream=terminal) as bar:
        worker.start()
        while worker.is_alive():
            worker.join(0.2)
            if out.exists():
                bar.set(min(out.stat().st_size, expected * 99 // 100))
    if not result or result[0] != 0:
        raise BackendError(f"llama.cpp could not quantize {src} to {quant.value} (status {result[0] if result else 'none'})")
    log.info("quantized to %s: %d bytes", quant.value, out.stat().st_size)

