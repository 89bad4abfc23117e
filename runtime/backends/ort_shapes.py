"""The shapes an .onnx file declares for its graph's inputs and outputs, read from the protobuf itself.

ONNX Runtime reports what it merged with its own shape inference: a negative dimension comes back as unknown,
and an output declared with 2^40 classes as whatever the graph computes, with only a warning. A file that
declares such shapes is malformed, and is refused here (runtime.backends.base.bounded_shape) before ONNX Runtime
sees it, in one line naming the tensor. The walk covers only the fields it needs (onnx.proto3):

* ModelProto.graph = 7; GraphProto.initializer = 5, input = 11, output = 12;
* ValueInfoProto.name = 1, type = 2; TypeProto.tensor_type = 1; TypeProto.Tensor.shape = 2;
* TensorShapeProto.dim = 1; Dimension.dim_value = 1 (int64), dim_param = 2 (a name: dynamic);
* TensorProto.name = 8 (an initializer listed among the inputs, as IR version 3 files do, is a weight, not an input).

Every length is checked against the buffer (runtime.formats.model_files.check_onnx has walked the top level already).
"""

from __future__ import annotations

from collections.abc import Iterator

from runtime.backends.base import DYNAMIC, bounded_shape
from runtime.errors import BadInput
from runtime.formats.model_files import varint

_GRAPH, _INITIALIZER, _INPUT, _OUTPUT = 7, 5, 11, 12
_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5


def _fields(buf: memoryview, where: str) -> Iterator[tuple[int, int, int | memoryview]]:
    """(field number, wire type, value) of one message: an int for varints and fixed fields, the bytes for LEN."""
    at = 0
    while at < len(buf):
        key, at = varint(buf, at, where)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, at = varint(buf, at, where)
            yield number, wire, value
        elif wire in (_FIXED64, _FIXED32):
            at += 8 if wire == _FIXED64 else 4
            yield number, wire, 0
        elif wire == _LEN:
            length, at = varint(buf, at, where)
            if at + length > len(buf):
                raise BadInput(f"{where}: not a valid ONNX file (field {number} of {length} bytes runs past its message)")
            yield number, wire, buf[at : at + length]
            at += length
        else:
            raise BadInput(f"{where}: not a valid ONNX file (wire type {wire} of field {number})")
        if at > len(buf):
            raise BadInput(f"{where}: not a valid ONNX file (field {number} runs past its message)")


def _signed(value: int) -> int:
    """An int64 as protobuf writes it: a negative one is the varint of its two's complement."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >> 63 else value


def _message(value: int | memoryview, what: str, where: str) -> memoryview:
    if isinstance(value, int):
        raise BadInput(f"{where}: not a valid ONNX file ({what} is not a message)")
    return value


def _value_info(buf: memoryview, where: str) -> tuple[str, list[int] | None]:
    """(name, declared dimensions, None when the tensor declares no shape) of a ValueInfoProto."""
    name, dims = "", None
    for number, wire, value in _fields(buf, where):
        if number == 1 and wire == _LEN:
            name = bytes(_message(value, "a name", where)).decode("utf-8", "replace")
        elif number == 2 and wire == _LEN:
            for n, w, tensor in _fields(_message(value, "a type", where), where):
                if n != 1 or w != _LEN:
                    continue  # sequence, map, optional, sparse: ONNX Runtime's own checks refuse what no classifier takes
                for n2, w2, shape in _fields(_message(tensor, "a tensor type", where), where):
                    if n2 == 2 and w2 == _LEN:
                        dims = [_dimension(_message(d, "a dimension", where), where)
                                for n3, w3, d in _fields(_message(shape, "a shape", where), where) if n3 == 1 and w3 == _LEN]
    return name, dims


def _dimension(buf: memoryview, where: str) -> int:
    for number, wire, value in _fields(buf, where):
        if number == 1 and wire == _VARINT:
            return _signed(int(value))  # type: ignore[arg-type]
    return DYNAMIC  # dim_param (a name) or nothing: the model leaves it open


def check_declared_shapes(data: bytes | memoryview, where: str) -> None:
    """Refuse ``data`` (an .onnx file's bytes) when a graph input or output declares a dimension that is zero or
    negative, or more elements than runtime.backends.base.MAX_TENSOR_ELEMENTS; one BadInput line naming it."""
    model = memoryview(data)
    for number, wire, graph in _fields(model, where):
        if number != _GRAPH or wire != _LEN:
            continue
        weights: set[str] = set()
        declared: list[tuple[str, list[int]]] = []
        for n, w, value in _fields(_message(graph, "the graph", where), where):
            if n == _INITIALIZER and w == _LEN:
                weights.update(bytes(_message(v, "a name", where)).decode("utf-8", "replace")
                               for n2, w2, v in _fields(_message(value, "an initializer", where), where) if n2 == 8 and w2 == _LEN)
            elif n in (_INPUT, _OUTPUT) and w == _LEN:
                name, dims = _value_info(_message(value, "an input or output", where), where)
                if dims is not None:
                    declared.append((name, dims))
        for name, dims in declared:
            if name not in weights:
                bounded_shape(where, name, dims)
