"""Quantization-aware distillation probe for MobileNetV2 INT8 (issue 4): can fine-tuning close the gap to 99 %?

Not part of the converter: a measurement, run once on a GPU machine, whose numbers the README reports.

``train`` (on a machine with a GPU and PyTorch; the torch here is CPU-only and would take hours): the student is
MobileNetV2 with BatchNorm folded, per-channel symmetric INT8 weights and per-tensor 8-bit activations at the
tensors TFLite quantizes (min/max ranges over the 128 calibration images, refreshed every 50 steps), all
fake-quantized with straight-through rounding; the teacher is the float model; the loss is KL(teacher || student)
on batches of 128 generated on the GPU. Data regimes:

  indomain  crops/flips/brightness of the 8 evaluation photos, fresh random draws (what a user's unlabeled camera
            images of the same scenes would be); ``photos=0,2,4,6`` trains on 4 of them, so the other 4 are unseen
  disjoint  crops of scikit-image/matplotlib images that share no photo with the evaluation set, colour gains, mixup

It prints the simulated INT8 agreement on the 200-image evaluation set and writes the folded float weights.

``verify`` (here): exports those weights through the converter's own TFLite route (litert-torch, ai-edge-quantizer
static INT8, min/max calibration on the same 128 images, weights rounded to nearest: QAT trained for that rounding)
and prints top-1 agreement with the original float TFLite model on the benchmark's 200 images.

    python3 bench/qat_probe.py train regimes=indomain lr=2e-5 budget=200 weights=PATH/mobilenet_v2-b0353104.pth
    .venv/bin/python bench/qat_probe.py verify OUT/qat_indomain_2e-5.pt ...
"""

import copy
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from converters.vision import photos, zoo  # noqa: E402
from converters.vision.mobilenet_v2 import ConvBN, InvertedResidual, MobileNetV2  # noqa: E402
from runtime.bundle.manifest import Layout, VisionSpec  # noqa: E402
from runtime.classify.preprocess import image_tensor  # noqa: E402

MEAN_PX, STD_PX = zoo.IMAGENET_MEAN, zoo.IMAGENET_STD


def build(weights=None):
    if weights is None:
        return zoo.find("mobilenet-v2").build()
    m = MobileNetV2()
    m.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    return m.eval()


def fold(model):
    """A copy of ``model`` with every Conv2d+BatchNorm2d pair folded into one biased Conv2d (the BN left as Identity)."""
    model = copy.deepcopy(model)
    for m in model.modules():
        if isinstance(m, nn.Sequential):
            kids = list(m._modules.items())
            for (kc, c), (kb, b) in zip(kids, kids[1:], strict=False):
                if isinstance(c, nn.Conv2d) and isinstance(b, nn.BatchNorm2d):
                    s = b.weight / torch.sqrt(b.running_var + b.eps)
                    conv = nn.Conv2d(c.in_channels, c.out_channels, c.kernel_size, c.stride, c.padding, groups=c.groups, bias=True)
                    conv.weight.data = c.weight.data * s[:, None, None, None]
                    bias = c.bias.data if c.bias is not None else torch.zeros_like(b.running_mean)
                    conv.bias.data = (bias - b.running_mean) * s + b.bias
                    m._modules[kc] = conv
                    m._modules[kb] = nn.Identity()
    return model.eval()


def eval_images():
    """The 8 photos, and the calibration and evaluation sets of bench/vision.py made from them."""
    base = [q.rgb for q in photos.photos()]
    return (base, *photos.benchmark_sets(base))


def verify(paths):
    import tempfile

    from converters.vision import gate, tflite
    from converters.vision.recipes import QuantScheme

    _, cal_imgs, ev_imgs = eval_images()
    spec = VisionSpec(size=224, layout=Layout.NHWC, mean=MEAN_PX, std=STD_PX)
    cal, ev = image_tensor(cal_imgs, spec), image_tensor(ev_imgs, spec)
    with tempfile.TemporaryDirectory() as tmp:
        ref_path, f_path, q_path = Path(tmp) / "ref.tflite", Path(tmp) / "f.tflite", Path(tmp) / "q.tflite"
        tflite.export_float(build(), cal, ref_path, nhwc=True)
        with gate.open_model(ref_path, "tflite", 2) as b:
            ref = gate.outputs(b, ev)
        for path in paths:
            m = fold(build())
            m.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
            tflite.export_float(m.eval(), cal, f_path, nhwc=True)
            tflite.quantize(f_path, QuantScheme.INT8, cal, q_path)
            with gate.open_model(q_path, "tflite", 2) as b:
                out = gate.outputs(b, ev)
            with gate.open_model(f_path, "tflite", 2) as b:
                fine = gate.outputs(b, ev)
            agree = ref.argmax(1) == out.argmax(1)
            print(
                f"{path}: INT8 top-1 agreement with float {agree.mean():.1%} (cosine min "
                f"{gate.compare(ref, out, None)['cosine_min']:.3f}; per photo "
                f"{', '.join(f'{a:.2f}' for a in (agree[i::8].mean() for i in range(8)))}); "
                f"the fine-tuned float model itself {(ref.argmax(1) == fine.argmax(1)).mean():.1%}",
                flush=True,
            )


if __name__ == "__main__" and sys.argv[1:2] == ["verify"]:
    verify(sys.argv[2:])
    sys.exit(0)
if __name__ != "__main__" or sys.argv[1:2] != ["train"]:
    sys.exit(
        "usage: qat_probe.py train [regimes=indomain,disjoint] [lr=2e-5] [budget=SECONDS] [bs=128] [photos=0,2,4,6] "
        "[tag=NAME] [weights=PTH] [out=DIR] | qat_probe.py verify WEIGHTS.pt ..."
    )

A = dict(a.split("=", 1) for a in sys.argv[2:])
BUDGET, BS, LR = float(A.get("budget", 150)), int(A.get("bs", 128)), float(A.get("lr", 2e-5))
REGIMES = A.get("regimes", "indomain,disjoint").split(",")
OUT = A.get("out", os.environ.get("OUT", "/tmp/qatout"))
os.makedirs(OUT, exist_ok=True)
dev = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
MEAN = torch.tensor(MEAN_PX, device=dev).view(1, 3, 1, 1)
STD = torch.tensor(STD_PX, device=dev).view(1, 3, 1, 1)
spec = VisionSpec(size=224, layout=Layout.NCHW, mean=MEAN_PX, std=STD_PX)
log = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "torch": torch.__version__, "args": A}


def p(*a):
    print(*a, flush=True)


class Round(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.round(x)

    @staticmethod
    def backward(ctx, g):
        return g


def fq(x, lo, hi):
    lo, hi = torch.clamp(lo, max=0), torch.clamp(hi, min=0)
    scale = ((hi - lo) / 255).clamp_min(1e-8)
    zp = torch.round(-lo / scale)
    return (torch.clamp(Round.apply(x / scale) + zp, 0, 255) - zp) * scale


def wq(w):
    s = (w.detach().abs().flatten(1).amax(1).clamp_min(1e-12) / 127).view((-1,) + (1,) * (w.dim() - 1))
    return torch.clamp(Round.apply(w / s), -127, 127) * s


class Q(nn.Module):
    """The student: folded model, fake-quantized weights, activation fake-quant at TFLite's INT8 tensors."""

    def __init__(self, folded):
        super().__init__()
        self.net = folded
        for m in folded.modules():
            if isinstance(m, nn.Conv2d):
                m.forward = lambda x, m=m: F.conv2d(x, wq(m.weight), m.bias, m.stride, m.padding, m.dilation, m.groups)
            if isinstance(m, nn.Linear):
                m.forward = lambda x, m=m: F.linear(x, wq(m.weight), m.bias)
        pts = []
        for m in folded.modules():
            if isinstance(m, ConvBN):
                pts.append(m)
            if isinstance(m, InvertedResidual):
                pts += [m.conv[-1], m]  # projection output (its BN is now Identity), then the block output (add)
        pts.append(folded.classifier)
        self.ranges = [None] * (len(pts) + 1)  # [0] is the input
        self.collect = False
        for i, m in enumerate(pts):
            m.register_forward_hook(lambda mod, inp, out, i=i + 1: self._hook(i, out))

    def _hook(self, i, out):
        if self.collect:
            lo, hi = out.detach().amin(), out.detach().amax()
            r = self.ranges[i]
            self.ranges[i] = (lo, hi) if r is None else (torch.minimum(r[0], lo), torch.maximum(r[1], hi))
            return None
        return fq(out, *self.ranges[i])

    def forward(self, x):
        if self.collect:
            self._hook(0, x)
        else:
            x = fq(x, *self.ranges[0])
        return self.net(x)

    @torch.no_grad()
    def calibrate(self, cal):
        self.ranges = [None] * len(self.ranges)
        self.collect = True
        for k in range(0, len(cal), 64):
            self(cal[k : k + 64])
        self.collect = False


@torch.no_grad()
def outputs(model, x):
    return torch.cat([model(x[k : k + 100]) for k in range(0, len(x), 100)])


# ---- data
base, cal_imgs, ev_imgs = eval_images()
cal = torch.from_numpy(image_tensor(cal_imgs, spec)).to(dev)
ev = torch.from_numpy(image_tensor(ev_imgs, spec)).to(dev)


def disjoint_images():
    """Images that share no photo with the evaluation set, all shipped inside scikit-image and matplotlib (the other
    scikit-image samples are fetched from the network: not these), as uint8 RGB."""
    import matplotlib
    import skimage.data as sd
    from PIL import Image

    imgs, names = [], []
    for n in (
        "brick",
        "camera",
        "clock",
        "coins",
        "colorwheel",
        "grass",
        "gravel",
        "horse",
        "hubble_deep_field",
        "immunohistochemistry",
        "logo",
        "moon",
        "page",
        "text",
        "retina",
        "cell",
        "microaneurysms",
    ):
        a = np.asarray(getattr(sd, n)())
        a = np.stack([a] * 3, -1) if a.ndim == 2 else a[..., :3]
        a = a.astype(np.float64)
        imgs.append((255 * (a - a.min()) / max(a.max() - a.min(), 1e-9)).astype(np.uint8))
        names.append(n)
    for face in sd.lfw_subset()[:20]:  # 25x25 grey faces
        imgs.append(np.stack([(255 * face).astype(np.uint8)] * 3, -1))
        names.append("lfw_subset")
    sample = Path(matplotlib.get_data_path()) / "sample_data"
    for f in ("Minduka_Present_Blue_Pack.png", "logo2.png"):
        imgs.append(np.asarray(Image.open(sample / f).convert("RGB")))
        names.append(f)
    return imgs, names


def to_gpu(imgs):
    return [torch.from_numpy(np.ascontiguousarray(i)).permute(2, 0, 1).float().to(dev) for i in imgs]


def batch(srcs, n, gen, mode):
    out = []
    for _ in range(n):
        img = srcs[int(torch.randint(len(srcs), (1,), generator=gen))]
        _, h, w = img.shape
        lo = 0.5 if mode == "indomain" else 0.3
        ch = int(h * (lo + (1 - lo) * torch.rand(1, generator=gen)))
        cw = int(w * (lo + (1 - lo) * torch.rand(1, generator=gen)))
        top = int(torch.randint(h - ch + 1, (1,), generator=gen))
        left = int(torch.randint(w - cw + 1, (1,), generator=gen))
        c = img[:, top : top + ch, left : left + cw]
        if torch.rand(1, generator=gen) < 0.5:
            c = c.flip(2)
        s = 256 / min(ch, cw)
        c = F.interpolate(
            c[None], size=(max(224, round(ch * s)), max(224, round(cw * s))), mode="bilinear", antialias=True, align_corners=False
        )[0]
        top, left = (c.shape[1] - 224) // 2, (c.shape[2] - 224) // 2
        c = c[:, top : top + 224, left : left + 224]
        contrast = 0.75 + 0.5 * torch.rand(1, generator=gen).item()
        bright = -25 + 50 * torch.rand(1, generator=gen).item()
        c = (c - 128) * contrast + 128 + bright
        if mode == "disjoint":
            c = c * (0.6 + 0.8 * torch.rand(3, 1, 1, generator=gen).to(dev))  # colour gains: most sources are grey
        out.append(c.clamp(0, 255).round())
    x = torch.stack(out)
    if mode == "disjoint":  # mixup on half the batch
        lam = torch.rand(n, 1, 1, 1, generator=gen).to(dev)
        mix = torch.rand(n, 1, 1, 1, generator=gen).to(dev) < 0.5
        x = torch.where(mix, lam * x + (1 - lam) * x.flip(0), x)
    return (x - MEAN) / STD


teacher = build(A.get("weights")).to(dev)
ref = outputs(teacher, ev)
ref_top = ref.argmax(1)


def agreement(student):
    o = outputs(student, ev)
    a = (o.argmax(1) == ref_top).float()
    return a.mean().item(), [round(a[i::8].mean().item(), 3) for i in range(8)]


keep = [int(i) for i in A["photos"].split(",")] if "photos" in A else list(range(8))
sources = {"indomain": to_gpu([base[i] for i in keep])}
if "disjoint" in REGIMES:
    dis_imgs, log["disjoint_sources"] = disjoint_images()
    sources["disjoint"] = to_gpu(dis_imgs)
TAG = A.get("tag", A.get("lr", "2e-5"))

for regime in REGIMES:
    student = Q(fold(build(A.get("weights")))).to(dev)
    student.calibrate(cal)
    a0 = agreement(student)
    p(regime, "start agreement", a0)
    rec = {"start": a0, "trace": []}
    opt = torch.optim.Adam(student.parameters(), lr=LR)
    gen = torch.Generator().manual_seed(1234)
    t0, step = time.time(), 0
    while True:
        el = time.time() - t0
        if el > BUDGET:
            break
        for g in opt.param_groups:
            g["lr"] = LR * 0.5 * (1 + math.cos(math.pi * min(1.0, el / BUDGET)))
        x = batch(sources[regime], BS, gen, regime)
        with torch.no_grad():
            t = teacher(x)
        s = student(x)
        loss = F.kl_div(F.log_softmax(s, 1), F.log_softmax(t, 1), log_target=True, reduction="batchmean")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if step % 50 == 0:
            student.calibrate(cal)
        if step % 200 == 0:
            a = agreement(student)
            rec["trace"].append((step, round(time.time() - t0, 1), round(loss.item(), 5), a[0]))
            p(regime, "step", step, "t", round(time.time() - t0), "loss", round(loss.item(), 5), "agreement", a[0])
    student.calibrate(cal)
    a1 = agreement(student)
    rec.update(end=a1, steps=step, seconds=round(time.time() - t0, 1))
    p(regime, "end", step, "steps", a1)
    log[regime] = rec
    torch.save({k: v.detach().cpu() for k, v in student.net.state_dict().items()}, os.path.join(OUT, f"qat_{regime}_{TAG}.pt"))
    with open(os.path.join(OUT, f"log_{regime}_{TAG}.json"), "w") as f:
        json.dump(log, f, indent=1)
p(json.dumps(log)[:3000])
