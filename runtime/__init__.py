"""edgerun runtime: load a bundle, plan its memory, run it offline.

Importing ``runtime`` imports no backend library (llama.cpp, LiteRT, ONNX Runtime);
a backend is imported when a model is loaded on it.
"""

__version__ = "0.1.0"
