"""The classifier conversion core that vision and audio share: source -> calibrate -> quantize -> gate -> package.

- core: the common options, the :class:`~converters.classifier.core.FrontEnd` protocol a kind of model fills in,
  and :func:`~converters.classifier.core.convert`, which runs the steps;
- quantize: the float model and the quantized one, with the INT8 candidate search (rounding, equalization);
- memory: the activation bytes the memory planner needs (ONNX peak analysis);
- package: the bundle's report files, its manifest, and publishing it.
"""
