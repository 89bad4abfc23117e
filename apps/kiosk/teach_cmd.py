"""``edgerun kiosk teach --good DIR [--bad DIR] --out BUNDLE``: an anomaly bundle from images of good parts.

Flags map one to one onto :class:`converters.anomaly.teach.Options`. Exit codes: 0 the bundle is written,
2 bad input (a missing folder, too few images, an existing --out, a rate out of range), 4 a converter package
missing, 7 the INT8 backbone failed its feature gate. Nothing is left at --out unless it succeeded.
"""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "teach an anomaly bundle (PatchCore, INT8 backbone) from a folder of good parts; defective ones tune it"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from converters.anomaly.backbone import BACKBONES, DEFAULT_BACKBONE
    from converters.anomaly.teach import DEFAULT_SIZE

    parser.add_argument("--good", required=True, type=Path, help="folder of images of good parts (searched recursively)")
    parser.add_argument("--bad", type=Path, help="folder of images of defective parts, optionally in one subfolder per "
                        "defect type: they tune the threshold, give AUROC and train the supervised head")
    parser.add_argument("--out", required=True, type=Path, help="the bundle to write: a directory, or NAME.edgerun")
    parser.add_argument("--false-reject", type=float, default=0.01,
                        help="the rate of good parts the threshold may reject, on held-out good images (default 0.01)")
    parser.add_argument("--coreset", type=float, default=0.1, help="fraction of good patches kept in the memory bank (default 0.1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the coreset selection (default 0)")
    parser.add_argument("--backbone", choices=sorted(BACKBONES), default=DEFAULT_BACKBONE, help=f"default {DEFAULT_BACKBONE}")
    parser.add_argument("--size", type=int, default=DEFAULT_SIZE, help=f"backbone input side in pixels (default {DEFAULT_SIZE})")
    parser.add_argument("--name", help="bundle name (default: from --out)")
    parser.add_argument("--version", help="bundle version (default: int8- and a hash of the bank)")
    parser.add_argument("--json", action="store_true", help="print the teach report as JSON")


def main(args: argparse.Namespace) -> int:
    from apps.cli.common import print_json
    from converters.anomaly.teach import Options, teach

    result = teach(Options(good=args.good, bad=args.bad, out=args.out, false_reject=args.false_reject, coreset=args.coreset,
                           seed=args.seed, backbone=args.backbone, size=args.size, name=args.name, version=args.version))
    rep = result.report
    if args.json:
        print_json({"out": str(result.out), "report": rep})
        return 0
    fr = rep["false_reject"]
    gate = rep["feature_gate"]
    print(f"wrote {result.out}: {rep['backbone']} INT8, bank {rep['bank_rows']} of {rep['patches']} patches "
          f"from {rep['teach_images']} good images")
    print(f"threshold {rep['threshold']:.4g} for a false-reject rate of {fr['chosen']:.2%}: "
          f"measured {fr['measured_held_out']:.2%} on {rep['held_out_good']} held-out good images")
    print(f"feature gate: INT8 vs float cosine mean {gate['cosine_mean']:.4f} (>= {gate['bound']}), "
          f"latency {gate['int8_latency_ms']:.1f} ms INT8 vs {gate['float_latency_ms']:.1f} ms float")
    if rep["auroc"] is not None:
        print(f"defective images: AUROC {rep['auroc']:.3f}, missed at the threshold {rep['missed_defects']:.2%}")
        for name, t in rep["defect_types"].items():
            print(f"  {name}: {t['images']} images, AUROC {t['auroc']:.3f}, missed {t['missed']:.2%}")
    if rep["head"] is not None:
        cv = rep["head"]["cv_auroc"]
        print(f"supervised head: cross-validated AUROC {'n/a' if cv is None else f'{cv:.3f}'}")
    return 0
