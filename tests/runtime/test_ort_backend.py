"""The ONNX Runtime backend computes INT8 convolutions exactly on every x86 CPU.

Without VNNI, ORT's fast uint8 x int8 kernel adds pairs of products in 16 bits
(VPMADDUBSW) and saturates: 255 * 127 * 2 = 64770 does not fit. The model below
makes every pair saturate, so on such a CPU (AVX2 without VNNI, like the machine
this was found on) the result halves unless the backend asks ORT for its exact
kernels. On VNNI and ARM CPUs the test passes either way: it states the contract.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from runtime.backends.ort import ORTBackend


def _saturating_int8_conv(tmp_path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime import quantization

    w = np.ones((8, 64, 1, 1), np.float32)  # weights at int8 127, inputs of 1.0 at uint8 255
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "conv",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4, 4])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    float_path, int8_path = tmp_path / "conv.onnx", tmp_path / "conv_int8.onnx"
    onnx.save(model, float_path)

    class Calib(quantization.CalibrationDataReader):
        def __init__(self) -> None:
            self.samples = iter([np.zeros((1, 64, 4, 4), np.float32), np.ones((1, 64, 4, 4), np.float32)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            x = next(self.samples, None)
            return None if x is None else {"x": x}

    quantization.quantize_static(str(float_path), str(int8_path), Calib(), quant_format=quantization.QuantFormat.QDQ,
                                 activation_type=quantization.QuantType.QUInt8,
                                 weight_type=quantization.QuantType.QInt8, per_channel=True)
    return int8_path


def test_int8_conv_does_not_saturate(tmp_path: Path) -> None:
    path = _saturating_int8_conv(tmp_path)
    with ORTBackend(path, threads=1) as backend:
        y = backend.run(np.ones((1, 64, 4, 4), np.float32))
    # 64 channels of 1.0 x 1.0; the output's own uint8 step is 64/255. Saturated, it reads about 32.
    np.testing.assert_allclose(y, 64.0, atol=0.5)
