"""Before publishing: the pinned llama.cpp must accept every name the converter wrote.

A GGUF names its architecture, tokenizer model and pre-tokenizer as strings
that llama.cpp looks up in its own tables; a name it does not know (``gpt2``
for its ``gpt-2``, say) makes the file unloadable, however right the weights.
A ``vocab_only`` load reads exactly the header, the hyper-parameters and the
vocabulary (no weights) through the llama.cpp the runtime will use, so it is
the honest check, and cheap: about a second for a 262k-token vocabulary.
"""

from __future__ import annotations

import logging
from pathlib import Path

from converters.llm.native_log import native_output_to_log
from runtime.errors import BackendError, missing

log = logging.getLogger(__name__)

_MARK = "error loading model: "


def check_loads(path: Path) -> None:
    """Raise BackendError with llama.cpp's own reason when it refuses ``path``'s header or vocabulary."""
    try:
        from llama_cpp import Llama
    except ImportError as exc:
        raise missing("llama_cpp", "convert") from exc
    lines: list[str] = []
    try:
        with native_output_to_log(lines):
            llm = Llama(str(path), vocab_only=True, verbose=True)  # verbose: the reason goes to the captured log
    except ValueError:
        reasons = [line.rsplit(_MARK, 1)[1] for line in lines if _MARK in line]
        reason = reasons[-1] if reasons else "no reason given"
        raise BackendError(f"the llama.cpp that edgerun runs refuses the converted GGUF ({reason});"
                           " nothing was written") from None
    try:
        log.info("llama.cpp accepts %s: architecture %s, tokenizer %s/%s", path.name,
                 llm.metadata.get("general.architecture"), llm.metadata.get("tokenizer.ggml.model"),
                 llm.metadata.get("tokenizer.ggml.pre", "-"))
    finally:
        llm.close()
