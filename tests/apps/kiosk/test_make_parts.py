"""scripts/make_parts.py: the seeded parts dataset (images, labels, belt video) the kiosk's tests and benchmark use."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import numpy as np
import pytest

from scripts import make_parts as mp

SMALL = dict(size=48, n_good=4, n_bad=2, video_parts=2, frames_per_part=3)


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_same_seed_same_bytes_and_other_seed_differs(tmp_path):
    a, b, c = (mp.write_dataset(tmp_path / n, seed=s, **SMALL) for n, s in (("a", 7), ("b", 7), ("c", 8)))
    assert a == b == c  # the same files and labels for any seed: only the pixels change
    ta, tb, tc = _tree(tmp_path / "a"), _tree(tmp_path / "b"), _tree(tmp_path / "c")
    assert ta == tb  # PNGs, CSVs and the mp4 itself are byte-identical for one seed
    pngs = [k for k in ta if k.endswith(".png")]
    assert len(pngs) == 4 + 2 * len(mp.DEFECTS)
    assert all(ta[k] != tc[k] for k in pngs) and ta["belt.mp4"] != tc["belt.mp4"]


def test_an_image_depends_only_on_seed_category_and_index():
    # asking for more images (or fewer of another category) must not change the ones already used in tests
    assert np.array_equal(mp.render(3, "spot", 5, 48), mp.render(3, "spot", 5, 48))
    assert not np.array_equal(mp.render(3, "spot", 5, 48), mp.render(3, "spot", 6, 48))
    img = mp.render(3, None, 0, 64)
    assert img.shape == (64, 64, 3) and img.dtype == np.uint8


@pytest.mark.parametrize("defect", mp.DEFECTS)
def test_each_defect_changes_the_part_it_is_drawn_on(defect):
    spec = mp.sample_part(np.random.default_rng(1), defect)
    clean = dataclasses.replace(spec, defect=None, missing=-1, strokes=(), color=mp._STEEL)
    if defect != "wrong_color":
        clean = dataclasses.replace(clean, color=spec.color)
    diff = np.abs(mp.draw(spec, 96).astype(int) - mp.draw(clean, 96).astype(int)).max(axis=2)
    assert (diff > 25).sum() >= 12, f"{defect} left the part almost unchanged"


def test_wrong_color_is_outside_the_good_parts_colour_range():
    def plate_hue_spread(img):  # (max - min) channel of the brightest quarter of pixels: the plate
        px = img.reshape(-1, 3).astype(float)
        bright = px[px.sum(1) >= np.quantile(px.sum(1), 0.8)]
        m = bright.mean(0)
        return (m.max() - m.min()) / m.mean()

    good = [plate_hue_spread(mp.render(0, None, i, 64)) for i in range(20)]
    wrong = [plate_hue_spread(mp.render(0, "wrong_color", i, 64)) for i in range(20)]
    assert max(good) < min(wrong)


def test_labels_and_split_keep_unseen_defects_out_of_teaching(tmp_path):
    rows = mp.write_dataset(tmp_path, seed=0, size=40, n_good=6, n_bad=4, teach_defects=("scratch", "spot"),
                            teach_fraction=0.5, video_parts=0)
    assert _rows(tmp_path / "labels.csv") == rows
    for r in rows:
        assert (tmp_path / r["file"]).is_file()
        assert r["label"] == ("good" if not r["defect"] else "bad")
        if r["defect"] in ("missing_hole", "wrong_color", "bent_edge"):
            assert (r["split"], r["seen"]) == ("test", "0")
    teach = _rows(tmp_path / "teach" / "labels.csv")
    assert sorted({r["defect"] for r in teach}) == ["", "scratch", "spot"]
    assert sum(r["label"] == "good" for r in teach) == 3 and len(teach) == 3 + 2 + 2
    assert all((tmp_path / "teach" / r["file"]).is_file() for r in teach)
    assert sorted(p.name for p in (tmp_path / "teach" / "bad").iterdir()) == ["scratch", "spot"]
    test = _rows(tmp_path / "test" / "labels.csv")
    assert len(test) == 3 + 2 + 2 + 3 * 4
    assert not (tmp_path / "belt.mp4").exists()


def test_belt_video_frames_and_labels(tmp_path):
    import cv2

    path = mp.write_video(tmp_path / "belt.mp4", seed=2, size=64, n_parts=4, frames_per_part=5)
    rows = _rows(tmp_path / "belt.csv")
    assert [int(r["frame"]) for r in rows] == list(range(20))
    assert [int(r["part"]) for r in rows] == [k for k in range(4) for _ in range(5)]
    defects = mp.belt_parts(2, 4)
    assert [r["defect"] for r in rows[::5]] == [d or "" for d in defects]
    assert rows[10]["label"] == "bad" and defects[2] in mp.DEFECTS  # every third part is bad
    cap = cv2.VideoCapture(str(path))
    decoded = []
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        decoded.append(frame[..., ::-1])
    cap.release()
    expected = [img for *_, img in mp.belt_frames(2, 64, 4, 5)]
    assert len(decoded) == 20 and decoded[0].shape == (64, 64, 3)
    # mp4v is lossy; each decoded frame is still far closer to its own rendering than to the next part's
    for i, img in enumerate(decoded):
        own = np.abs(img.astype(int) - expected[i]).mean()
        assert own < 12, (i, own)
    assert np.abs(decoded[0].astype(int) - expected[5]).mean() > np.abs(decoded[0].astype(int) - expected[0]).mean()
    # the part moves: first and last frame of one part differ
    assert np.abs(expected[0].astype(int) - expected[4]).mean() > 5


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--size", "8"], "outside 32..512"),  # too small to draw holes
        (["--good", "100000"], "outside 0..20000"),  # bounded so a typo cannot fill the disk
        (["--teach-defects", "scratch,dent"], "unknown defect 'dent'; valid: scratch, spot"),
        (["--teach-fraction", "1.5"], "outside 0.0..1.0"),
        (["--frames-per-part", "x"], "'x' is not an integer"),
    ],
)
def test_cli_rejects_bad_flags_with_one_line(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        mp.main([str(tmp_path / "out"), *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_cli_writes_the_dataset(tmp_path, capsys):
    assert mp.main([str(tmp_path), "--size", "40", "--good", "2", "--bad", "1", "--video-parts", "1", "--frames-per-part", "2"]) == 0
    assert "7 images and belt.mp4" in capsys.readouterr().out
    assert len(_rows(tmp_path / "labels.csv")) == 7 and len(_rows(tmp_path / "belt.csv")) == 2
