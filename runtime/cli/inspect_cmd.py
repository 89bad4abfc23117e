"""``edgerun inspect MODEL``: manifest, GGUF metadata and conversion reports."""

from __future__ import annotations

import argparse

from runtime.cli.common import print_json
from runtime.gguf_file import read_gguf
from runtime.resolve import resolve
from runtime.units import fmt_bytes

HELP = "show a model's manifest, file metadata and quality reports"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="bundle path, .gguf file, installed name[@version], or 'default'")
    parser.add_argument("--json", action="store_true")


def main(args: argparse.Namespace) -> int:
    model = resolve(args.model)
    manifest = model.manifest
    info = read_gguf(model.path()) if manifest.model_format == "gguf" else None
    if args.json:
        data = {"manifest": manifest.to_dict(), "directory": str(model.directory), "origin": model.origin}
        if info is not None:
            data["gguf"] = {"version": info.version, "tensors": len(info.tensors), "tensor_bytes": info.tensor_bytes,
                            "metadata": info.summary()}
        print_json(data)
        return 0
    print(f"{manifest.ref}  ({manifest.kind.value}, {manifest.backend.value}, {manifest.model_format})")
    print(f"  license: {manifest.license}")
    print(f"  location: {model.directory} ({model.origin})")
    for f in manifest.files:
        print(f"  file: {f.path}  {fmt_bytes(f.size)}  sha256 {f.sha256[:16]}...")
    if manifest.llm:
        spec = manifest.llm
        print(f"  architecture: {spec.architecture}, trained context {spec.context_length}, quantization {spec.quantization}")
        print(f"  chat template: {'yes' if spec.chat_template else 'none (base model)'}")
        if spec.sampling:
            print("  default sampling: " + ", ".join(f"{k}={v}" for k, v in spec.sampling.items()))
    if info is not None:
        print(f"  GGUF v{info.version}: {len(info.tensors)} tensors, {fmt_bytes(info.tensor_bytes)}")
        for key, value in info.summary().items():
            if key != "tokenizer.chat_template":
                print(f"    {key} = {value}")
    for name, report in manifest.reports.items():
        if isinstance(report, dict):  # e.g. the converter's quality report: one measured number per line
            print(f"  report {name}:")
            for key, value in report.items():
                print(f"    {key} = {value}")
        else:
            print(f"  report {name}: {report}")
    return 0
