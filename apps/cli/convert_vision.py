"""``edgerun convert vision MODEL --calib DIR|NPZ --out BUNDLE ...``: flags map one to one onto :class:`pipeline.Options`."""

from __future__ import annotations

import argparse
from pathlib import Path

from apps.cli import flags
from apps.cli.common import print_json
from converters.vision import gate
from converters.vision.recipes import Format, QuantScheme, Rounding, parse
from runtime.bundle.manifest import ColorOrder, Layout, ResizeMode
from runtime.errors import BadInput

CODE_WARNING = (
    "A .pt2, TorchScript or Keras/SavedModel source is code: loading it can run what it carries, so "
    "convert only files you trust (a warning on stderr says so for each)"
)
HELP = "image classifier (PyTorch zoo:NAME/.pt2/TorchScript or ONNX) -> calibrated INT8/INT4/FP16 TFLite or ONNX bundle"


def _floats(text: str, flag: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise BadInput(f"{flag} {text!r} is not valid: give one number or three separated by commas (pixel units 0-255)") from None
    if len(values) not in (1, 3):
        raise BadInput(f"{flag} {text!r} is not valid: give one number (all channels) or three (one per channel)")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        help="zoo:NAME (efficientnet-lite0, mobilenet-v2), a .pt2 ExportedProgram, a TorchScript file, an .onnx "
        f"file, or a .keras file or SavedModel directory. {CODE_WARNING}",
    )
    parser.add_argument(
        "--calib", required=True, type=Path, help="calibration set: a folder of images or an .npz of float inputs (100-500 samples)"
    )
    add_output_arguments(parser)
    parser.add_argument(
        "--size",
        type=flags.integer(8, 4096, "pixels; 4096 x 4096 x 3 floats is 192 MiB per image"),
        help="square input side in pixels (default: the model's)",
    )
    parser.add_argument("--layout", choices=[v.value for v in Layout], help="input layout (default nhwc for tflite, nchw for onnx)")
    parser.add_argument("--mean", help="per-channel mean in pixel units, one or three values: input = (pixel - mean) / std")
    parser.add_argument("--std", help="per-channel std in pixel units, one or three values")
    parser.add_argument("--color-order", default="rgb", choices=[v.value for v in ColorOrder])
    parser.add_argument("--resize", default="center-crop", choices=[v.value for v in ResizeMode])
    parser.add_argument("--labels", type=Path, help="class labels, one per line")
    parser.add_argument(
        "--eval",
        type=Path,
        help="evaluation set (folder, optionally with label-named subfolders, or .npz with x, y; "
        "default: every fifth --calib sample, held out of calibration)",
    )
    parser.add_argument(
        "--equalize",
        default="off",
        choices=["on", "off"],
        help="INT8 for PyTorch sources: also try evening out activation ranges across channels (exact "
        "rewrites of the float model) and keep the INT8 model closest to float on the calibration "
        "set; about a minute more per candidate (default off; see converters/vision/equalize.py)",
    )
    add_gate_arguments(parser)


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """--out, --quant, --format: shared by the vision and audio converters."""
    parser.add_argument("--out", required=True, type=Path, help="bundle directory, or a NAME.edgerun transport file")
    parser.add_argument(
        "--quant", default="auto", choices=[q.value for q in QuantScheme],
        help="recipe (default auto: int8 for CNNs, int4w for matmul-heavy)",
    )
    parser.add_argument("--format", default="tflite", choices=[f.value for f in Format], help="tflite (LiteRT) or onnx (ONNX Runtime)")
    parser.add_argument(
        "--rounding",
        default="gptq",
        choices=[r.value for r in Rounding],
        help="INT8 weight rounding for PyTorch sources: gptq (default; keeps each layer's output on the "
        "calibration set, about a minute for an ImageNet CNN) or nearest",
    )


def add_gate_arguments(parser: argparse.ArgumentParser) -> None:
    """--min-agreement, --name, --version, --json: shared by the vision and audio converters."""
    parser.add_argument(
        "--min-agreement",
        type=float,
        help="override the default accuracy gate: pass on top-1 (detectors: decision) agreement with the "
        "float model over every evaluation sample at or above this fraction, and on that alone. The "
        f"default gate asks for top-1 agreement >= {gate.STABLE_AGREEMENT_MIN:.0%} on the samples whose "
        f"float decision survives +-1 grey level of noise, top-5 agreement >= {gate.TOP5_AGREEMENT_MIN:.0%}, "
        f"and with labels an accuracy drop <= {gate.ACCURACY_DROP_MAX:.0%} (detectors: decision agreement "
        f">= {gate.DETECTOR_AGREEMENT_MIN:.0%} over every sample); the report carries both".replace("%", "%%"),
    )  # argparse formats help with %
    parser.add_argument("--name", help="bundle name (default: from the model)")
    parser.add_argument("--version", help="bundle version (default: QUANT-FORMAT)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def main(args: argparse.Namespace) -> int:
    from converters.vision.pipeline import Options, convert

    opts = Options(
        model=args.model,
        calib=args.calib,
        out=args.out,
        quant=parse(QuantScheme, args.quant, "--quant"),
        fmt=parse(Format, args.format, "--format"),
        rounding=parse(Rounding, args.rounding, "--rounding"),
        equalize=args.equalize == "on",
        size=args.size,
        layout=Layout(args.layout) if args.layout else None,
        mean=_floats(args.mean, "--mean") if args.mean else None,
        std=_floats(args.std, "--std") if args.std else None,
        color_order=ColorOrder(args.color_order),
        resize=ResizeMode(args.resize),
        labels=args.labels,
        eval=args.eval,
        min_agreement=args.min_agreement,
        name=args.name,
        version=args.version,
    )
    if opts.std is not None and any(s <= 0 for s in opts.std):
        raise BadInput(f"--std {args.std} must be positive")
    result = convert(opts)
    r = result.report
    if args.json:
        print_json({"bundle": str(result.out), "ref": result.manifest.ref, "report": r})
        return 0
    print(
        f"wrote {result.out} ({result.manifest.ref}, {r['recipe']} {r['format']}): {r['why']}; {rounding_line(r['rounding'])}"
        f"{equalization_line(r.get('equalization'))}"
    )
    acc = ""
    if r["accuracy_float"] is not None:
        acc = f", accuracy float {r['accuracy_float']:.1%} / quantized {r['accuracy_quant']:.1%} on {r['labelled']} labelled"
    print(f"  gate on {r['samples']} {r['evaluation']}: {r['gate']['verdict']}")
    print(
        f"  top-1 agreement {r['top1_agreement']:.1%}, top-5 {r['top5_agreement']:.1%}, cosine min {r['cosine_min']:.4f}, "
        f"max abs error {r['max_abs_error']:.3g}{acc}; float vs itself under +-1 grey level of noise {r['float_self_agreement']:.1%}"
    )
    print(f"  size {r['float_bytes'] / 2**20:.1f} -> {r['quant_bytes'] / 2**20:.1f} MiB, {latency_line(r)}")
    return 0


def latency_line(r: dict) -> str:
    """Float and quantized latency as measured at conversion, their ratio and where."""
    ratio = "" if r.get("latency_ratio") is None else f"{r['latency_ratio']:.2f}x float; "
    return (
        f"latency {r['float_latency_ms']:.2f} -> {r['quant_latency_ms']:.2f} ms ({ratio}"
        f"batch 1, 1 thread, median of {gate.LATENCY_RUNS} runs on {r['cpu']} at conversion)"
    )


def rounding_line(rounding: dict) -> str:
    """How the weights were rounded, for the conversion's summary line."""
    if rounding["method"] == Rounding.GPTQ.value:
        rest = f", {len(rounding['nearest'])} to nearest (too few calibration rows)" if rounding.get("nearest") else ""
        return f"weights rounded by GPTQ ({rounding['layers']} layers{rest}, {rounding['seconds']:.0f} s)"
    return f"weights rounded to nearest{': ' + rounding['why'] if 'why' in rounding else ''}"


def equalization_line(eq: dict | None) -> str:
    """What activation equalization did (reports from before it existed lack it)."""
    if not eq:
        return ""
    if "kept" in eq:
        kl = eq["calibration_kl"]
        tried = ", ".join(f"{t} {v:.4g}" for t, v in kl.items())
        what = f"kept {eq['kept']!r}" + (f" ({eq['depthwise_pairs']} depthwise inputs, {eq['streams']} streams)" if eq["applied"] else "")
        return f"; activation equalization: {what}, calibration KL {tried}"
    return f"; activations not equalized: {eq['why']}"
