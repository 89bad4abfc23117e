"""edgerun runtime: load a bundle, plan its memory, run it offline.

Importing ``runtime`` imports no backend library (llama.cpp, LiteRT, ONNX Runtime);
a backend is imported when a model is loaded on it.
"""

import os

__version__ = "0.1.0"

# ONNX Runtime (1.29 and later) starts telemetry when it is imported: a device id and an event database under
# ~/.cache/Microsoft/DeveloperTools/, and uploads. An offline runtime writes only under its own folders, and
# the variable must be set before anything imports onnxruntime. An explicit setting by the user is kept.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
