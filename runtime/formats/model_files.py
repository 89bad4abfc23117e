"""Checks on .tflite and .onnx files before any native runtime parses them.

A damaged or hostile file must fail here with a one-line error naming what is
wrong, never inside LiteRT or ONNX Runtime (which may abort the process).

TFLite is a FlatBuffer: bytes 0-3 are the little-endian offset of the root
table, bytes 4-7 the file identifier ``TFL3``. We walk the root ``Model`` table
far enough to see its vtable, version and the subgraphs and buffers vectors in
bounds. ONNX is a protobuf ``ModelProto``: we walk the top-level wire format
(every field's tag and length in bounds) and require ``ir_version`` (field 1)
and ``graph`` (field 7); where the ``onnx`` package is installed (the
workstation) ``onnx.checker`` then checks the graph itself.
"""

from __future__ import annotations

import struct
from pathlib import Path

from runtime.errors import BadInput, one_line

TFLITE_IDENTIFIER = b"TFL3"
TFLITE_SCHEMA_VERSION = 3
# Field slots of tflite.Model (schema.fbs): version, operator_codes, subgraphs, description, buffers.
_MODEL_VERSION, _MODEL_SUBGRAPHS, _MODEL_BUFFERS = 0, 2, 4
ONNX_IR_VERSION_FIELD, ONNX_GRAPH_FIELD = 1, 7
MAX_MODEL_BYTES = 2 << 30  # protobuf's own limit; a larger model uses external data, which bundles do not carry


def _u32(buf: bytes, at: int, what: str, where: str) -> int:
    if at < 0 or at + 4 > len(buf):
        raise BadInput(f"{where}: not a valid TFLite file ({what} at byte {at} is past the end, {len(buf)} bytes)")
    return struct.unpack_from("<I", buf, at)[0]


def check_tflite(path: Path) -> None:
    where = str(path)
    buf = _read(path)
    if len(buf) < 8 or buf[4:8] != TFLITE_IDENTIFIER:
        raise BadInput(f"{where}: not a TFLite model (file identifier {buf[4:8]!r}, expected {TFLITE_IDENTIFIER!r})")
    root = _u32(buf, 0, "root table offset", where)
    vtable = root - struct.unpack("<i", buf[root : root + 4])[0] if root + 4 <= len(buf) else -1
    if not 0 <= vtable <= len(buf) - 4:
        raise BadInput(f"{where}: not a valid TFLite file (root table at {root}, vtable at {vtable} out of bounds)")
    vt_size, table_size = struct.unpack_from("<HH", buf, vtable)
    if vt_size < 4 or vt_size % 2 or vtable + vt_size > len(buf) or root + table_size > len(buf):
        raise BadInput(f"{where}: not a valid TFLite file (vtable of {vt_size} bytes, table of {table_size} bytes)")

    def field(slot: int) -> int:
        at = 4 + 2 * slot
        return struct.unpack_from("<H", buf, vtable + at)[0] if at < vt_size else 0

    off = field(_MODEL_VERSION)
    version = _u32(buf, root + off, "version", where) if off else 0
    if version != TFLITE_SCHEMA_VERSION:
        raise BadInput(f"{where}: TFLite schema version {version} is not supported (expected {TFLITE_SCHEMA_VERSION})")
    for slot, name in ((_MODEL_SUBGRAPHS, "subgraphs"), (_MODEL_BUFFERS, "buffers")):
        off = field(slot)
        if not off:
            raise BadInput(f"{where}: not a valid TFLite file (the model has no {name})")
        vec = root + off + _u32(buf, root + off, f"{name} offset", where)
        count = _u32(buf, vec, f"{name} length", where)
        if vec + 4 + 4 * count > len(buf) or (name == "subgraphs" and count == 0):
            raise BadInput(f"{where}: not a valid TFLite file ({name} vector of {count} entries does not fit)")


def varint(buf: bytes | memoryview, at: int, where: str) -> tuple[int, int]:
    """(the protobuf varint at ``at`` in an ONNX file's bytes, the offset after it); BadInput if truncated or overlong."""
    value = shift = 0
    while True:
        if at >= len(buf) or shift > 63:
            raise BadInput(f"{where}: not a valid ONNX file (truncated or overlong varint at byte {at})")
        byte = buf[at]
        value |= (byte & 0x7F) << shift
        at += 1
        shift += 7
        if not byte & 0x80:
            return value, at


def check_onnx(path: Path) -> None:
    where = str(path)
    buf = _read(path)
    at, seen = 0, set()
    while at < len(buf):
        key, at = varint(buf, at, where)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise BadInput(f"{where}: not a valid ONNX file (field number 0 at byte {at})")
        if wire == 0:
            _, at = varint(buf, at, where)
        elif wire == 1:
            at += 8
        elif wire == 5:
            at += 4
        elif wire == 2:
            length, at = varint(buf, at, where)
            at += length
        else:
            raise BadInput(f"{where}: not a valid ONNX file (wire type {wire} of field {number})")
        if at > len(buf):
            raise BadInput(f"{where}: not a valid ONNX file (field {number} runs past the end: truncated?)")
        seen.add((number, wire))
    if (ONNX_IR_VERSION_FIELD, 0) not in seen or (ONNX_GRAPH_FIELD, 2) not in seen:
        raise BadInput(f"{where}: not an ONNX model (no ir_version or graph at the top level)")
    try:
        import onnx
    except ModuleNotFoundError:  # the device: onnxruntime only; the wire walk above is the check
        return
    try:
        onnx.checker.check_model(onnx.load_from_string(buf), full_check=False)
    except Exception as exc:
        # the checker's messages span several lines
        raise BadInput(f"{where}: ONNX checker rejects the model ({type(exc).__name__}: {one_line(exc, 300)})") from None


def _read(path: Path) -> bytes:
    try:
        size = path.stat().st_size
        if size > MAX_MODEL_BYTES:
            raise BadInput(f"{path}: {size} bytes is larger than the {MAX_MODEL_BYTES}-byte limit of a single model file")
        return path.read_bytes()
    except OSError as exc:
        raise BadInput(f"{path}: cannot read the model ({exc.strerror})") from None


CHECKS = {"tflite": check_tflite, "onnx": check_onnx}


def check_model_file(path: Path, model_format: str) -> None:
    try:
        check = CHECKS[model_format]
    except KeyError:
        raise BadInput(f"model format {model_format!r} is not valid here (valid: {', '.join(CHECKS)})") from None
    check(path)
