"""``edgerun inspect MODEL``: manifest, GGUF metadata and conversion reports."""

from __future__ import annotations

import argparse

from apps.cli.common import print_json
from apps.cli.terminal import printable
from runtime.bundle.resolve import resolve
from runtime.formats.gguf_file import read_gguf
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
    # Every line goes through printable(): the manifest, the GGUF metadata and the reports are the file's author's text.
    out = [f"{manifest.ref}  ({manifest.kind.value}, {manifest.backend.value}, {manifest.model_format})",
           f"  license: {manifest.license}"]
    if manifest.source:
        out.append("  source: " + ", ".join(f"{k}={v}" for k, v in manifest.source.items()))
    out.append(f"  location: {model.directory} ({model.origin})")
    out += [f"  file: {f.path}  {fmt_bytes(f.size)}  sha256 {f.sha256[:16]}..." for f in manifest.files]
    if manifest.llm:
        spec = manifest.llm
        out.append(f"  architecture: {spec.architecture}, trained context {spec.context_length}, quantization {spec.quantization}")
        out.append(f"  chat template: {'yes' if spec.chat_template else 'none (base model)'}")
        if spec.sampling:
            out.append("  default sampling: " + ", ".join(f"{k}={v}" for k, v in spec.sampling.items()))
    if info is not None:
        out.append(f"  GGUF v{info.version}: {len(info.tensors)} tensors, {fmt_bytes(info.tensor_bytes)}")
        out += [f"    {key} = {value}" for key, value in info.summary().items() if key != "tokenizer.chat_template"]
    for name, report in manifest.reports.items():
        if isinstance(report, dict):  # e.g. the converter's quality report: one measured number per line
            out.append(f"  report {name}:")
            out += [f"    {key} = {value}" for key, value in report.items()]
        else:
            out.append(f"  report {name}: {report}")
    for line in out:
        print(printable(line))
    return 0
