"""``edgerun run BUNDLE --input FILE...``: top-k labels and scores for images, from a vision bundle."""

from __future__ import annotations

import argparse
import sys

from runtime.classifier import DEFAULT_TOP_K, Classifier
from runtime.cli.common import print_json
from runtime.errors import BadInput
from runtime.units import parse_size


def main(args: argparse.Namespace) -> int:
    k = DEFAULT_TOP_K if args.top_k is None else args.top_k
    if k < 1:
        raise BadInput(f"--top-k {k} is not valid: use an integer >= 1")
    if args.threads is not None and args.threads < 1:
        raise BadInput(f"--threads {args.threads} is not valid: use an integer >= 1")
    with Classifier.load(
        args.model,
        threads=args.threads,
        target=args.target,
        require_accelerator=args.require_accelerator,
        memory=parse_size(args.memory) if args.memory else None,
        batch=len(args.input),
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
        for pred in predictions:
            print(pred.source)
            for lab in pred.labels:
                print(f"  {lab.score:7.2%}  {lab.label}  ({lab.index})")
    return 0
