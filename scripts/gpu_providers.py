"""The GPU check's ONNX Runtime and LiteRT part: what the machine's packages offer, and a real run where they allow.

    python scripts/gpu_providers.py --gpu|--dry --out providers.json

ONNX Runtime: the providers the installed package has (devices.capabilities.probe, as edgerun sees them); with a
GPU provider (CUDA/TensorRT), a generated ONNX model (tests/runtime/modelgen.matmul_onnx) runs through edgerun's
ORTBackend placed with --target gpu, and the nodes each provider took are reported (the backend's own Offload).
Otherwise it names the package that would bring one (onnxruntime-gpu, built for the machine's CUDA major).
LiteRT: whether ai-edge-litert (or tflite-runtime) imports and whether its GPU delegate library loads; if not, what
is missing. Nothing here fails the check: each answer is a result.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def ort_part() -> dict:
    from devices.backends import BackendName
    from devices.capabilities import probe

    caps = probe(BackendName.ORT)
    out: dict = {"installed": caps.installed, "version": caps.version, "providers": list(caps.providers or ()),
                 "error": caps.error}
    gpu = [p for p in out["providers"] if p in ("CUDAExecutionProvider", "TensorrtExecutionProvider")]
    if not caps.installed:
        out["needs"] = "onnxruntime-gpu (a CUDA 13 build for this driver) or onnxruntime for the CPU"
        return out
    if not gpu:
        out["needs"] = ("onnxruntime-gpu built for CUDA 13 (this machine's onnxruntime has only "
                        + ", ".join(out["providers"]) + ")")
        return out
    from devices.placement import resolve_placement
    from runtime.backends.ort import ORTBackend
    from tests.runtime.modelgen import matmul_onnx

    try:
        placement = resolve_placement(BackendName.ORT, "gpu", threads=1)
        with tempfile.TemporaryDirectory() as tmp, ORTBackend(matmul_onnx(Path(tmp) / "m.onnx"), None, placement) as b:
            offload = b.offload()
        out["run"] = {"placement": placement.summary(), "offload": str(offload)}
    except Exception as exc:  # a result to report, not a failure of the check
        out["run"] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
    return out


def litert_part() -> dict:
    from devices.backends import BackendName
    from devices.capabilities import probe

    caps = probe(BackendName.LITERT)
    out = {"installed": caps.installed, "version": caps.version, "delegates": list(caps.delegates or ()),
           "gpu": caps.gpu, "error": caps.error}
    if not caps.installed:
        out["needs"] = "ai-edge-litert (pip) for the interpreter; its GPU delegate is a separate native library"
    elif not caps.gpu:
        out["needs"] = "LiteRT's GPU delegate library (OpenCL/OpenGL ES; not in the pip wheel for x86-64 Linux)"
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--gpu", action="store_true")
    mode.add_argument("--dry", action="store_true")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    result = {}
    from devices.backends import BackendName

    for name, part in ((BackendName.ORT.value, ort_part), (BackendName.LITERT.value, litert_part)):
        try:
            result[name] = part()
        except Exception as exc:  # report, do not fail the check
            result[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
    args.out.write_text(json.dumps(result, indent=1, default=str))
    print("providers: " + "; ".join(f"{k}: {v.get('run') or v.get('needs') or v.get('providers') or v.get('error')}"
                                   for k, v in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
