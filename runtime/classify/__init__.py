"""Classifiers on ONNX Runtime or LiteRT: images (preprocessing), audio (wake words and detectors, through the
bundle's feature front end), anomaly detection (PatchCore), and their memory plan.
"""
