"""``edgerun run BUNDLE --input FILE... [--top N]``: the N best labels and scores for images (vision) or WAV files (audio)."""

from __future__ import annotations

import argparse
import sys

from apps.cli.common import print_json
from apps.cli.terminal import printable
from runtime.bundle.manifest import ModelKind
from runtime.bundle.resolve import ResolvedModel
from runtime.classify.classifier import DEFAULT_TOP_K, Classifier


def main(args: argparse.Namespace, resolved: ResolvedModel) -> int:
    """``resolved`` is the vision or audio bundle ``args.model`` named; the flags were checked by run_cmd and argparse."""
    k = DEFAULT_TOP_K if args.top is None else args.top
    kind = resolved.manifest.kind
    extra = {}
    if kind is ModelKind.AUDIO:
        from runtime.classify.audio_classifier import AudioClassifier
        from runtime.classify.audio_frontend import wav_info

        loader = AudioClassifier.load
        extra["inputs"] = [wav_info(p) for p in args.input]  # headers checked before loading; the plan counts reading them
    else:
        loader = Classifier.load  # type: ignore[assignment]
    with loader(
        str(resolved.directory),
        threads=args.threads,
        target=args.target,
        require_accelerator=args.require_accelerator,
        memory=args.memory,
        batch=len(args.input),
        **extra,
    ) as clf:
        if not args.json:
            print(f"edgerun: {clf.placement.summary()}", file=sys.stderr)
        predictions = clf.classify_files(args.input, k)
        if args.json:
            print_json({
                "model": clf.model.manifest.ref,
                "predictions": [p.to_dict() for p in predictions],
                "placement": clf.placement.to_dict(),
                "plan": clf.plan.to_dict(),
            })
            return 0
        if hasattr(sys.stdout, "reconfigure"):  # a file name that is not UTF-8 is printed as its own bytes, like ls does
            sys.stdout.reconfigure(errors="surrogateescape")
        for pred in predictions:
            print(pred.source + _audio_line(pred))
            for lab in pred.labels:
                print(f"  {lab.score:7.2%}  {printable(lab.label)}  ({lab.index})")  # the bundle author's text
    return 0


def _audio_line(pred: object) -> str:
    if not hasattr(pred, "at_seconds"):
        return ""
    extra = f" ({pred.seconds:.2f} s" + (f", resampled from {pred.resampled_from} Hz" if pred.resampled_from else "") + ")"
    if pred.detected is not None:
        extra += f": {'DETECTED' if pred.detected else 'not detected'} at {pred.at_seconds:.2f} s"
    return extra
