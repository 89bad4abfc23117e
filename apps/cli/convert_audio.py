"""``edgerun convert audio MODEL --calib WAV_DIR|NPZ --out BUNDLE ...``: flags map one to one onto :class:`pipeline.Options`."""

from __future__ import annotations

import argparse
from pathlib import Path

from apps.cli.common import print_json
from apps.cli.convert_vision import CODE_WARNING, add_gate_arguments, add_output_arguments, latency_line, rounding_line
from converters.vision.recipes import Format, QuantScheme, Rounding, parse
from runtime.classify.audio_frontend import FrontEnd

HELP = "audio classifier/detector (zoo:NAME, .pt2 or .onnx) + its feature front end -> calibrated INT8/INT4/FP16 TFLite or ONNX bundle"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="zoo:NAME (openwakeword-alexa, openwakeword-weather), a .pt2 ExportedProgram, or an "
                        f".onnx file. {CODE_WARNING}")
    parser.add_argument("--calib", required=True, type=Path,
                        help="calibration set: a folder of .wav files (through the front end) or an .npz with 'x' (model inputs)")
    add_output_arguments(parser)
    parser.add_argument("--frontend", choices=[f.value for f in FrontEnd],
                        help="feature front end (default: the zoo model's; waveform for files)")
    parser.add_argument("--frontend-model", action="append", type=Path, default=[],
                        help="front-end model file, in order (openwakeword: melspectrogram.onnx then embedding_model.onnx)")
    parser.add_argument("--sample-rate", type=int, help="the model's sample rate in Hz (WAVs at other rates are resampled)")
    parser.add_argument("--labels", type=Path, help="class labels, one per line")
    parser.add_argument("--eval", type=Path, help="evaluation set: a folder of .wav files or an .npz with 'x' "
                        "(default: every fifth --calib file, held out of calibration)")
    parser.add_argument("--threshold", type=float, default=0.5, help="detectors: the score that counts as detected (default 0.5)")
    add_gate_arguments(parser)


def main(args: argparse.Namespace) -> int:
    from converters.audio.pipeline import Options, convert
    from runtime.errors import BadInput

    if args.sample_rate is not None and not 1000 <= args.sample_rate <= 384_000:
        raise BadInput(f"--sample-rate {args.sample_rate} is not valid (1000..384000 Hz)")
    opts = Options(
        model=args.model, calib=args.calib, out=args.out,
        quant=parse(QuantScheme, args.quant, "--quant"), fmt=parse(Format, args.format, "--format"),
        rounding=parse(Rounding, args.rounding, "--rounding"),
        frontend=FrontEnd(args.frontend) if args.frontend else None, frontend_files=tuple(args.frontend_model),
        sample_rate=args.sample_rate, labels=args.labels, eval=args.eval, min_agreement=args.min_agreement,
        threshold=args.threshold, name=args.name, version=args.version,
    )
    result = convert(opts)
    r = result.report
    if args.json:
        print_json({"bundle": str(result.out), "ref": result.manifest.ref, "report": r})
        return 0
    print(f"wrote {result.out} ({result.manifest.ref}, {r['recipe']} {r['format']}, {r['frontend']} front end at {r['sample_rate']} Hz): "
          f"{r['why']}; {rounding_line(r['rounding'])}")
    acc = ""
    if r["accuracy_float"] is not None:
        acc = f"; clips right: float {r['accuracy_float']:.1%} / quantized {r['accuracy_quant']:.1%} of {r['labelled']} labelled"
    print(f"  gate on {r['samples']} windows, {r['evaluation']}: {r['gate']['verdict']}")
    print(f"  agreement {r['top1_agreement']:.1%}, max abs error {r['max_abs_error']:.3g}{acc}")
    print(f"  size {r['float_bytes'] / 2**20:.2f} -> {r['quant_bytes'] / 2**20:.2f} MiB, {latency_line(r)}")
    return 0
