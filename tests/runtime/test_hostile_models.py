"""Hostile ONNX and TFLite models inside otherwise valid vision bundles, through `edgerun run` in a child process.

docs/trust.md, "Backends": every tensor shape a model file declares is bounded before anything is sized by it
(runtime.backends.base.bounded_shape), and a bad file is one line and exit 2, never a traceback, a hang or an
allocation the file asked for. Each case is a model the packages' own writers (onnx.helper, LiteRT's FlatBuffer
schema) produce and onnx.checker accepts, so it reaches the backend: the tests below are about what the backend
does with it. The child has bounded time and address space (tests/runtime/hostile_cli.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from runtime.backends.base import MAX_TENSOR_ELEMENTS
from tests.runtime.hostile_cli import assert_ran, assert_refused, bundle_around, edgerun_child

HUGE = (1 << 40) - 1  # the batch that asked numpy for 768 TiB (2^40 rows of 8x8x3 float32) to pad one image
ONNX_SECTION = {"size": 8, "layout": "nchw", "resize": "stretch", "output_is_logits": True}
TFLITE_SECTION = {**ONNX_SECTION, "layout": "nhwc"}
W = (np.arange(30, dtype=np.float32).reshape(3, 10) % 7 - 3)  # channel means -> 10 logits


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from PIL import Image

    path = tmp_path_factory.mktemp("image") / "in.png"
    Image.fromarray(np.full((12, 12, 3), (10, 120, 240), np.uint8)).save(path)
    return path


def _onnx(path: Path, x_shape: list, y_shape: list, *, x_type: int | None = None, inputs: int = 1, outputs: int = 1) -> Path:
    """x -> GlobalAveragePool -> Flatten -> MatMul(W) -> y, with the declared shapes and input type given; extra
    inputs are added to nothing (declared, never read), extra outputs are copies of y."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    x_type = TensorProto.FLOAT if x_type is None else x_type
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["pooled"]), helper.make_node("Flatten", ["pooled"], ["means"]),
             helper.make_node("MatMul", ["means", "w"], ["y"])]
    nodes += [helper.make_node("Identity", ["y"], [f"y{i}"]) for i in range(1, outputs)]
    ins = [helper.make_tensor_value_info("x", x_type, x_shape)]
    ins += [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, [1, 3]) for i in range(1, inputs)]
    outs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, y_shape) for name in ["y", *(f"y{i}" for i in range(1, outputs))]]
    graph = helper.make_graph(nodes, "g", ins, outs, [numpy_helper.from_array(W, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


# (id, model arguments, exit code, what the one line names). Why each exists:
ONNX_CASES = [
    # a fixed batch of 2^40-1: the batch of one image was padded to it, and numpy raised _ArrayMemoryError
    ("batch-2^40-1", dict(x_shape=[HUGE, 3, 8, 8], y_shape=[HUGE, 10]), 2,
     f"tensor 'x' has shape [{HUGE}, 3, 8, 8], {HUGE * 192} elements: more than the {MAX_TENSOR_ELEMENTS}"),
    # an image side of 2^20: 3 x 2^40 elements declared for one row
    ("side-2^20", dict(x_shape=["N", 3, 1 << 20, 1 << 20], y_shape=["N", 10]), 2, "tensor 'x' has shape [-1, 3, 1048576, 1048576]"),
    # an output of 2^40 classes
    ("output-2^40", dict(x_shape=["N", 3, 8, 8], y_shape=["N", 1 << 40]), 2, "tensor 'y' has shape [-1, 1099511627776]"),
    # a zero batch was read as "dynamic" and fed one row; a zero side held nothing
    ("zero-batch", dict(x_shape=[0, 3, 8, 8], y_shape=[0, 10]), 2, "tensor 'x' has shape [0, 3, 8, 8]: dimension 0 is not valid"),
    ("zero-side", dict(x_shape=["N", 3, 0, 8], y_shape=["N", 10]), 2, "dimension 0 is not valid"),
    # negative sizes are no shape at all
    ("negative-batch", dict(x_shape=[-5, 3, 8, 8], y_shape=[-5, 10]), 2, "'x'"),
    ("negative-output", dict(x_shape=["N", 3, 8, 8], y_shape=["N", -10]), 2, "'y'"),
    # inputs the runtime does not feed
    ("double-input", dict(x_shape=["N", 3, 8, 8], y_shape=["N", 10], x_type=11), 2, "double"),
    ("int64-input", dict(x_shape=["N", 3, 8, 8], y_shape=["N", 10], x_type=7), 2, "tensor(int64)"),
    ("string-input", dict(x_shape=["N", 3, 8, 8], y_shape=["N", 10], x_type=8), 2, ""),
    # a classifier has one input and one output
    ("two-inputs", dict(x_shape=["N", 3, 8, 8], y_shape=["N", 10], inputs=2), 2, "one input and one output; this model has 2 and 1"),
    ("200-inputs", dict(x_shape=["N", 3, 8, 8], y_shape=["N", 10], inputs=200), 2, "this model has 200 and 1"),
    ("two-outputs", dict(x_shape=["N", 3, 8, 8], y_shape=["N", 10], outputs=2), 2, "this model has 1 and 2"),
    # the model takes (N, 3, 8, 16): not the manifest's 8 px square
    ("not-the-manifest-shape", dict(x_shape=["N", 3, 8, 16], y_shape=["N", 10]), 2, "the model takes (-1, 3, 8, 16)"),
]


@pytest.mark.parametrize("case, kwargs, code, needle", ONNX_CASES, ids=[c[0] for c in ONNX_CASES])
def test_hostile_onnx_is_one_line(tmp_path: Path, image: Path, case: str, kwargs: dict, code: int, needle: str) -> None:
    bundle = bundle_around(tmp_path, _onnx(tmp_path / "model.onnx", **kwargs), ONNX_SECTION)
    assert_refused(edgerun_child("run", bundle, "--input", image, "--json"), code, needle)


def test_symbolic_dimensions_take_the_manifest_size(tmp_path: Path, image: Path) -> None:
    # (N, C, H, W), every dimension symbolic: the model takes any image and the manifest says 8 px RGB. It was
    # refused because (-1, -1, -1, -1) is not (N, 3, 8, 8); a dynamic dimension matches any size.
    bundle = bundle_around(tmp_path, _onnx(tmp_path / "model.onnx", x_shape=["N", "C", "H", "W"], y_shape=["N", "K"]), ONNX_SECTION)
    (pred,) = assert_ran(edgerun_child("run", bundle, "--input", image, "--json", "--top", "1"))
    means = (np.array([10, 120, 240], np.float32) - 127.5) / 127.5  # the default mean and std
    assert pred["labels"][0]["index"] == int(np.argmax(means @ W))


def _tflite(path: Path, image_shape: list[int], means_shape: list[int] | None = None, input_type: int | None = None) -> Path:
    """image (N, H, W, 3) -> MEAN over H, W -> FULLY_CONNECTED -> 10 logits (tests/runtime/modelgen.image_tflite),
    with the image's declared shape (the batch stays dynamic), the inner tensor's and the input's type given."""
    from ai_edge_litert import schema_py_generated as fb

    from tests.runtime.modelgen import _tflite as write

    mean = fb.ReducerOptionsT()
    mean.keepDims = False
    f32, i32 = fb.TensorType.FLOAT32, fb.TensorType.INT32
    tensors = [("image", image_shape, f32 if input_type is None else input_type, None),
               ("axes", [2], i32, np.array([1, 2], np.int32)), ("means", means_shape or [1, 3], f32, None),
               ("weights", [10, 3], f32, W.T.copy()), ("logits", [1, 10], f32, None)]
    ops = [(fb.BuiltinOperator.MEAN, [0, 1], [2], fb.BuiltinOptions.ReducerOptions, mean),
           (fb.BuiltinOperator.FULLY_CONNECTED, [2, 3, -1], [4], fb.BuiltinOptions.FullyConnectedOptions, fb.FullyConnectedOptionsT())]
    return write(path, tensors, ops)


TFLITE_CASES = [
    # 2^15 x 2^15 pixels: 3.2e9 elements declared; LiteRT would size its arena by it at allocate_tensors
    ("side-2^15", dict(image_shape=[1, 1 << 15, 1 << 15, 3]), "tensor 'image' has shape [-1, 32768, 32768, 3]"),
    # an inner tensor declared with 2^30 elements: checked with every tensor, before the arena is sized
    ("inner-2^30", dict(image_shape=[1, 8, 8, 3], means_shape=[1, 1 << 30]), "tensor 'means' has shape [1, 1073741824]"),
    ("zero-side", dict(image_shape=[1, 0, 8, 3]), ""),
    ("negative-side", dict(image_shape=[1, -4, 8, 3]), ""),
    # an int64 image: the manifest says float32
    ("int64-input", dict(image_shape=[1, 8, 8, 3], input_type=4), ""),
]


@pytest.mark.parametrize("case, kwargs, needle", TFLITE_CASES, ids=[c[0] for c in TFLITE_CASES])
def test_hostile_tflite_is_one_line(tmp_path: Path, image: Path, case: str, kwargs: dict, needle: str) -> None:
    pytest.importorskip("ai_edge_litert", reason="the LiteRT backend is an optional extra")
    bundle = bundle_around(tmp_path, _tflite(tmp_path / "model.tflite", **kwargs), TFLITE_SECTION)
    assert_refused(edgerun_child("run", bundle, "--input", image, "--json"), 2, needle)


def test_a_sound_tflite_of_the_same_build_runs(tmp_path: Path, image: Path) -> None:
    # the generator itself is sound: the same model with honest shapes runs and gives the hand-computed label
    pytest.importorskip("ai_edge_litert", reason="the LiteRT backend is an optional extra")
    bundle = bundle_around(tmp_path, _tflite(tmp_path / "model.tflite", image_shape=[1, 8, 8, 3]), TFLITE_SECTION)
    (pred,) = assert_ran(edgerun_child("run", bundle, "--input", image, "--json", "--top", "1"))
    means = (np.array([10, 120, 240], np.float32) - 127.5) / 127.5
    assert pred["labels"][0]["index"] == int(np.argmax(means @ W))


def test_bounded_shape_table() -> None:
    # the rule itself, on the edges: dynamic dimensions count as 1, the bound is inclusive, products are exact
    from runtime.backends.base import bounded_shape
    from runtime.errors import BadInput

    assert bounded_shape("m", "x", [-1, 3, 8, 8]) == (-1, 3, 8, 8)
    assert bounded_shape("m", "x", [MAX_TENSOR_ELEMENTS]) == (MAX_TENSOR_ELEMENTS,)
    assert bounded_shape("m", "t", [0, 4], empty_ok=True) == (0, 4)  # an empty inner tensor is allowed
    for dims, message in (([MAX_TENSOR_ELEMENTS + 1], "more than"), ([1 << 32, 1 << 32, 0], "dimension 0"),
                          ([1 << 32, 1 << 32], "18446744073709551616 elements"), ([3, -2], "dimension -2"), ([-1, 0], "dimension 0")):
        with pytest.raises(BadInput, match=message) as err:
            bounded_shape("m.onnx", "x", dims)
        assert str(err.value).startswith("m.onnx: tensor 'x' has shape ") and "\n" not in str(err.value)
