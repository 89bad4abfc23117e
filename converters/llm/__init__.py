"""LLM converter: Hugging Face checkpoint -> GGUF -> llama.cpp-quantized GGUF bundle with a quality report.

``convert(ConvertOptions(...))`` is the Python API behind ``edgerun convert llm``.
The conversion uses numpy, gguf and llama-cpp-python, plus matplotlib (the KL
plot) and sentencepiece (SentencePiece tokenizers) from the ``convert`` extra;
torch and transformers are needed only by the parity tests and
scripts/derive_hf_checkpoint.py, and nothing here imports them.
"""

from __future__ import annotations

from converters.llm.options import ConvertOptions, Quant
from converters.llm.pipeline import Conversion, QualityGateFailed, convert

__all__ = ["Conversion", "ConvertOptions", "QualityGateFailed", "Quant", "convert"]
