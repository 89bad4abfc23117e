"""GPTQ weight rounding: it lowers each layer's output error, and both quantizers keep the integers it chose."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from converters.vision import onnx_route, rounding, tflite  # noqa: E402
from converters.vision.recipes import QuantScheme  # noqa: E402


def _correlated(n: int, k: int, seed: int) -> np.ndarray:
    """Inputs whose features are strongly correlated (as real activations are), the case where GPTQ pays."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, 4)) @ rng.standard_normal((4, k)) + 0.1 * rng.standard_normal((n, k))).astype(np.float32)


def test_gptq_lowers_the_layer_output_error_and_stays_on_the_int8_grid() -> None:
    torch.manual_seed(0)
    layer = nn.Linear(64, 32)
    both = _correlated(3072, 64, seed=1)
    x, held_out = both[:2048], both[2048:]  # rounded on the first, judged on samples it never saw
    w = layer.weight.data.numpy().copy()
    summary = rounding.round_weights(layer, x)
    gptq = layer.weight.data.numpy()
    assert summary["method"] == "gptq" and summary["layers"] == 1
    np.testing.assert_allclose(rounding.nearest(gptq), gptq, rtol=0, atol=1e-6 * np.abs(w).max())  # exactly INT8 steps
    # each channel keeps its largest weight, so the quantizer recomputes the same scale
    np.testing.assert_allclose(np.abs(gptq).max(1), np.abs(w).max(1), rtol=1e-6)
    err_nearest = np.square(held_out @ (w - rounding.nearest(w)).T).mean()
    err_gptq = np.square(held_out @ (w - gptq).T).mean()
    assert err_gptq < 0.5 * err_nearest, (err_gptq, err_nearest)


class Tiny(nn.Module):
    """Conv+BN+ReLU6, a depthwise conv, a 1x1 projection and a classifier: the shapes of a MobileNet block."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6(),
            nn.Conv2d(16, 16, 3, 1, 1, groups=16, bias=False), nn.BatchNorm2d(16), nn.ReLU6(),
            nn.Conv2d(16, 8, 1, bias=False), nn.BatchNorm2d(8),
        )
        self.head = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean((2, 3)))


def _tiny(x: np.ndarray) -> nn.Module:
    torch.manual_seed(3)
    model = Tiny()
    model.train()
    with torch.no_grad():  # warm the batch-norm statistics: random ones make every INT8 check meaningless
        for _ in range(20):
            model(torch.from_numpy(x))
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):  # non-trivial scales, some negative, for the folding to move
            m.weight.data = torch.linspace(-2.0, 3.0, m.num_features)
    return model.eval()


def _expected_integers(model: nn.Module) -> list[np.ndarray]:
    """Each layer's INT8 weights after folding its BatchNorm, in torch's layout: round(w / (max|w| / 127))."""
    out = []
    seq = list(model.features)
    for i, m in enumerate(seq):
        if isinstance(m, nn.Conv2d):
            bn = seq[i + 1]
            w = (m.weight * (bn.weight / torch.sqrt(bn.running_var + bn.eps)).reshape(-1, 1, 1, 1)).detach().numpy()
            out.append(w)
    out.append(model.head.weight.detach().numpy())
    return [np.round(w / (np.abs(w.reshape(len(w), -1)).max(1) / 127).reshape(-1, *[1] * (w.ndim - 1))).astype(np.int8) for w in out]


def _tflite_int8_weights(path: Path) -> list[np.ndarray]:
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_path=str(path))
    out = []
    for t in it.get_tensor_details():
        if t["dtype"] == np.int8 and len(t["quantization_parameters"]["scales"]) > 1:
            w = it.get_tensor(t["index"])
            if w.ndim == 4 and w.shape[0] == 1:  # depthwise: 1 x H x W x C
                w = w.transpose(3, 0, 1, 2)
            elif w.ndim == 4:  # OHWI
                w = w.transpose(0, 3, 1, 2)
            out.append(w)
    return out


def _onnx_int8_weights(path: Path) -> list[np.ndarray]:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    return [numpy_helper.to_array(i) for i in model.graph.initializer if i.data_type == onnx.TensorProto.INT8 and len(i.dims) > 1]


@pytest.mark.parametrize("fmt", ["tflite", "onnx"])
def test_quantizers_keep_the_integers_gptq_chose(tmp_path: Path, fmt: str) -> None:
    x = np.random.default_rng(0).uniform(-1, 1, (64, 3, 16, 16)).astype(np.float32)
    model = _tiny(x)
    rounded = copy.deepcopy(model)
    rounding.round_weights(rounded, x)
    want = _expected_integers(rounded)
    assert any(not np.array_equal(w, n) for w, n in zip(want, _expected_integers(model), strict=True))  # GPTQ moved some
    if fmt == "tflite":
        nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
        tflite.export_float(rounded, nhwc, tmp_path / "float.tflite", nhwc=True)
        tflite.quantize(tmp_path / "float.tflite", QuantScheme.INT8, nhwc, tmp_path / "int8.tflite")
        got = _tflite_int8_weights(tmp_path / "int8.tflite")
    else:
        onnx_route.export_float(rounded, x, tmp_path / "float.onnx")
        onnx_route.quantize(tmp_path / "float.onnx", QuantScheme.INT8, x, tmp_path / "int8.onnx", tmp_path)
        got = _onnx_int8_weights(tmp_path / "int8.onnx")
    for w in want:
        same_shape = [g for g in got if g.shape == w.shape]
        assert same_shape, f"no INT8 weight of shape {w.shape} in the {fmt} model"
        # the quantizer rounded GPTQ's float weights back to GPTQ's integers exactly (off by one would show)
        assert min(int(np.abs(g.astype(np.int16) - w).max()) for g in same_shape) == 0


def test_a_graph_only_module_keeps_nearest_rounding() -> None:
    x = torch.zeros(1, 3, 16, 16)
    program = torch.export.export(Tiny().eval(), (x,))
    assert not rounding.has_layers(program.module())
    assert rounding.has_layers(Tiny())


def test_same_padding_sees_the_patches_explicit_padding_sees() -> None:
    x = torch.randn(2, 3, 9, 9)
    h_same, rows_same = rounding._hessian(nn.Conv2d(3, 4, 3, padding="same"), x)
    h_one, rows_one = rounding._hessian(nn.Conv2d(3, 4, 3, padding=1), x)
    assert rows_same == rows_one == 2 * 9 * 9  # every output position, borders included
    torch.testing.assert_close(h_same, h_one)
