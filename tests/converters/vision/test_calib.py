"""Calibration sets: capped folders sampled across their class folders, and the evaluation samples held out of
calibration when no --eval is given."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from apps.cli import main as edgerun
from converters.vision.calib import HOLD_OUT_EVERY, MIN_CALIBRATION, MIN_EVALUATION, Samples, balanced, hold_out, load_samples
from runtime.bundle.manifest import VisionSpec
from runtime.errors import BadInput
from tests.converters.vision.conftest import convert_args
from tests.converters.vision.digits import Digits


def _files(root: Path, counts: dict[str, int]) -> list[Path]:
    return sorted(root / folder / f"{i:03d}.png" for folder, n in counts.items() for i in range(n))


def test_a_capped_folder_is_sampled_round_robin_over_its_subfolders(tmp_path: Path) -> None:
    files = _files(tmp_path, {"ant": 6, "bee": 2, "cat": 6})
    picked = balanced(files, 7)
    # the first 7 sorted files would all be ants; round-robin takes every folder in turn
    assert [p.parent.name for p in picked] == ["ant", "bee", "cat", "ant", "bee", "cat", "ant"]
    assert [p.name for p in picked[:3]] == ["000.png"] * 3 and picked[3].name == "001.png"
    assert sorted(balanced(files, None)) == files and sorted(balanced(files, 100)) == files  # under the cap: all of them


def test_load_samples_sees_every_class_folder_under_the_cap(tmp_path: Path) -> None:
    from PIL import Image

    names = ["ant", "bee", "cat"]
    for i, name in enumerate(names):  # 12 images per class, each class its own grey level
        for j in range(12):
            (tmp_path / name).mkdir(exist_ok=True)
            Image.fromarray(np.full((4, 4, 3), 50 * (i + 1), np.uint8)).save(tmp_path / name / f"{j:02d}.png")
    got = load_samples(tmp_path, VisionSpec(size=4), (1, 4, 4, 3), names, limit=9)
    assert got.labels is not None and sorted(got.labels.tolist()) == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def _samples(n: int, labelled: bool = True) -> Samples:
    return Samples(np.arange(n, dtype=np.float32).reshape(n, 1), np.arange(n) % 3 if labelled else None,
                   tuple(f"s{i}" for i in range(n)))


def test_hold_out_keeps_every_fifth_sample_for_the_gate() -> None:
    cal, ev = hold_out(_samples(23, labelled=False))  # one class (no labels, no subfolders): every fifth sample
    assert ev.x[:, 0].tolist() == [4, 9, 14, 19] and ev.names == ("s4", "s9", "s14", "s19") and ev.labels is None
    assert len(cal.x) == 19 and not set(cal.x[:, 0].tolist()) & set(ev.x[:, 0].tolist())  # disjoint
    cal, ev = hold_out(_samples(30))  # labels i % 3: within each class, sample r of class g when (r + g) % 5 == 4
    assert ev.x[:, 0].tolist() == [8, 10, 12, 23, 25, 27] and ev.labels.tolist() == [2, 1, 0, 2, 1, 0]  # labels follow
    assert HOLD_OUT_EVERY == 5  # 20 %, as the CLI help and the report say


def test_hold_out_keeps_every_class_in_both_parts() -> None:
    # balanced()'s round-robin order over 5 and 10 class folders: holding out every fifth position would hold out
    # one whole class (5 folders) or two (10 folders, digits' "four" and "nine") and never calibrate on them.
    for classes in (5, 10):
        labels = np.tile(np.arange(classes), 10)
        x = np.arange(len(labels), dtype=np.float32)[:, None]
        names = tuple(f"c{c}/{i:03d}.png" for i, c in enumerate(labels))
        for samples in (Samples(x, labels, names), Samples(x, None, names)):  # by label, else by subfolder
            cal, ev = hold_out(samples)
            cal_classes = {n.split("/")[0] for n in cal.names}
            ev_classes = [n.split("/")[0] for n in ev.names]
            assert cal_classes == set(ev_classes) == {f"c{c}" for c in range(classes)}
            assert all(ev_classes.count(f"c{c}") == 2 for c in range(classes))  # 2 of each class's 10
            assert len(ev.x) == len(x) // HOLD_OUT_EVERY and not set(cal.x[:, 0]) & set(ev.x[:, 0])


def test_hold_out_refuses_a_set_too_small_to_split() -> None:
    cal, ev = hold_out(_samples(20, labelled=False))  # 20 samples: 16 calibrate, 4 are scored
    assert (len(cal.x), len(ev.x)) == (16, MIN_EVALUATION)
    with pytest.raises(BadInput, match=r"too few to hold 20 % out for the accuracy gate \(3 held out, at least 4 needed\)"
                                       r".*give at least 20 "):
        hold_out(_samples(19, labelled=False))  # 15 would calibrate, but a gate over 3 samples says nothing
    with pytest.raises(BadInput, match=r"\(0 held out, at least 4 needed\)"):
        hold_out(_samples(MIN_CALIBRATION))


def test_without_eval_the_gate_scores_held_out_samples(digits: Digits, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the labelled evaluation folder as --calib and no --eval: a fifth of it is held out, balanced over the labels
    args = convert_args(digits, tmp_path / "b", "onnx")
    i = args.index("--eval")
    args[args.index("--calib") + 1] = args[i + 1]
    del args[i : i + 2]
    capsys.readouterr()
    assert edgerun(args) == 0
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    n = len(digits.test_images)
    # one in five of each of the 10 label folders: n / 5 give or take one per class
    assert abs(report["samples"] - n / HOLD_OUT_EVERY) <= 10 and report["calibration_samples"] == n - report["samples"]
    assert report["evaluation"].startswith("samples held out of --calib") and "no --eval given" in report["evaluation"]
    assert report["labelled"] == report["samples"]  # every held-out sample keeps its label folder
    assert "held out of --calib" in capsys.readouterr().out  # and the CLI line says so
