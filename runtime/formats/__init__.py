"""File formats read and checked before any native library sees them: GGUF, WAV, TFLite and ONNX.
"""
