"""Activation equalization before static INT8: rescale channels so one per-tensor activation range fits them all.

TFLite and ONNX Runtime give each activation tensor one INT8 range. When a
tensor's channels span very different ranges (MobileNetV2's first convolution
puts channels peaking at 0.03 and at 3.7 into one range), the small channels
keep a handful of levels. Two exact rewrites of a PyTorch model move that
spread into the weights, where INT8 is per channel:

* **depthwise inputs** (cross-layer equalization, Nagel et al. 2019): a
  convolution (+ BatchNorm) + ReLU/ReLU6 feeding a depthwise convolution. Output
  channel c of the first is multiplied by s_c and input channel c of the
  depthwise one divided by s_c; s_c brings every channel to the largest
  channel's calibration maximum. Both layers are quantized per output channel,
  so their INT8 weights lose nothing. ReLU commutes with the scaling; ReLU6
  stays as it is (fused, no new op): channels that saturate at 6 keep s_c = 1,
  and the others are raised to 6, so their clip falls at their own calibration
  maximum (values above what calibration saw are clipped there, as a
  per-channel INT8 range would clip them).
* **streams consumed by convolutions** (SmoothQuant, Xiao et al. 2023): a tensor
  made by convolutions (+ BatchNorm), possibly summed through residual adds, and
  read only by ordinary convolutions (MobileNetV2's bottleneck streams). Channel c
  of every producer is divided by s_c and input column c of every consumer
  multiplied by s_c, s_c = xmax_c^alpha / wmax_c^(1-alpha), which trades range
  between the activation and the consumers' weights; GPTQ then rounds those
  weights knowing their inputs.

The model is traced with torch.fx; what is not a recognised pattern is left
alone, and the rewritten float model must give the original's outputs on the
calibration set or the rewrite is dropped (the report says why). The converter
(``--equalize on``) quantizes each of ``CONFIGS`` besides the model as it is and
keeps the one closest to float on the calibration set. Measured (issue 4,
bench/vision.py, GPTQ weights, 200 evaluation images): MobileNetV2's top-1
agreement with float 80 -> 89 % (TFLite) and 78.5 -> 83.5 % (ONNX), worst-case
cosine 0.958 -> 0.983-0.986, with streams at alpha 0.8 kept; EfficientNet-Lite0,
built for INT8 with even ranges, gains nothing (its best candidate agreed less).
"""

from __future__ import annotations

import copy
import logging
import operator
import time
from typing import Any

import numpy as np
import torch
from torch import nn

log = logging.getLogger(__name__)

ALPHA = 0.5  # SmoothQuant's migration strength: half of the range moves into the consumers' weights
# what `--equalize on` tries, besides the model as it is: (tag, alpha, streams too)
CONFIGS = (("depthwise inputs", ALPHA, False), ("streams alpha 0.5", 0.5, True), ("streams alpha 0.8", 0.8, True))
LIVE = 1e-3  # channels whose maximum is below this fraction of the tensor's are left unscaled (dead channels)
LIMIT = 1e3  # no channel is scaled by more than this, either way
VERIFY_SAMPLES = 8
TOLERANCE = 1e-3  # max |rewritten - original| over max |original| on the verification samples


def _tracer() -> Any:
    import torch.fx as fx

    class Tracer(fx.Tracer):
        # convolutions with "same" padding done in forward() (EfficientNet ports) stay one node
        def is_leaf_module(self, m: Any, qualname: str) -> bool:
            return isinstance(m, (nn.Conv2d, nn.Linear, nn.BatchNorm2d, nn.ReLU, nn.ReLU6)) or super().is_leaf_module(m, qualname)

    return Tracer()


class _Graph:
    """The traced model with the questions the rewrites ask of its nodes."""

    def __init__(self, gm: Any) -> None:
        self.gm = gm
        self.uses: dict[str, int] = {}
        for node in gm.graph.nodes:
            if node.op == "call_module":
                self.uses[node.target] = self.uses.get(node.target, 0) + 1

    def module(self, node: Any, kind: Any) -> Any:
        """The node's module if it is a ``kind`` called from this node only, else None."""
        if node.op != "call_module" or self.uses.get(node.target) != 1:
            return None
        m = self.gm.get_submodule(node.target)
        return m if isinstance(m, kind) else None

    def act(self, node: Any) -> str | None:
        from torch.nn import functional as F

        if node.op == "call_module":
            m = self.gm.get_submodule(node.target)
            return "relu6" if isinstance(m, nn.ReLU6) else "relu" if isinstance(m, nn.ReLU) else None
        if node.op == "call_function" and node.target in (F.relu, torch.relu):
            return "relu"
        if node.op == "call_function" and node.target is F.relu6:
            return "relu6"
        return None

    def depthwise(self, node: Any) -> Any:
        conv = self.module(node, nn.Conv2d)
        if conv is not None and conv.groups == conv.in_channels == conv.out_channels:
            return conv
        return None

    def dense_conv(self, node: Any) -> Any:
        conv = self.module(node, nn.Conv2d)
        return conv if conv is not None and conv.groups == 1 else None

    def producer(self, node: Any) -> tuple[Any, Any] | None:
        """(conv, bn or None) when ``node`` is BN(conv(x)) or conv(x) with a bias, each used by the next only."""
        bn = self.module(node, nn.BatchNorm2d)
        if bn is not None and bn.affine:
            src = node.args[0]
            conv = self.module(src, nn.Conv2d)
            if conv is not None and len(src.users) == 1:
                return conv, bn
            return None
        conv = self.module(node, nn.Conv2d)
        if conv is not None and conv.bias is not None:
            return conv, None
        return None

    @staticmethod
    def is_add(node: Any) -> bool:
        return (
            node.op == "call_function"
            and node.target in (operator.add, torch.add)
            and len(node.args) == 2
            and not node.kwargs
            and all(hasattr(a, "op") for a in node.args)
        )


def _scale_out(conv: Any, bn: Any, s: Any) -> None:
    """Multiply output channel c of conv (+ bn) by s_c."""
    if bn is not None:
        bn.weight.data *= s
        bn.bias.data *= s
        return
    conv.weight.data *= s.reshape(-1, *[1] * (conv.weight.dim() - 1))
    conv.bias.data *= s


def _depthwise_pairs(g: _Graph) -> list[tuple[Any, Any, Any, str]]:
    """(act node, producer (conv, bn), depthwise conv, act kind) for conv(+BN)+ReLU(6) -> depthwise conv chains."""
    out = []
    for node in g.gm.graph.nodes:
        kind = g.act(node)
        if kind is None or len(node.users) != 1 or not node.args or not hasattr(node.args[0], "op"):
            continue
        src = node.args[0]
        prod = g.producer(src)
        dw = g.depthwise(next(iter(node.users)))
        if prod is None or dw is None or len(src.users) != 1:
            continue
        if prod[0].out_channels != dw.in_channels:
            continue
        out.append((node, prod, dw, kind))
    return out


def _streams(g: _Graph, taken: set[Any]) -> list[tuple[list[Any], list[tuple[Any, Any]], list[Any]]]:
    """(tensor nodes, their producers, consumer convs) for every set of tensors joined by residual adds whose
    tensors come from conv(+BN) or adds of the set and go only to adds of the set or to ordinary convolutions."""
    parent: dict[Any, Any] = {}

    def find(n: Any) -> Any:
        while parent.get(n, n) is not n:
            n = parent[n]
        return n

    nodes = list(g.gm.graph.nodes)
    for node in nodes:
        if g.is_add(node):
            for a in node.args:
                parent[find(a)] = find(node)
    groups: dict[Any, list[Any]] = {}
    for node in nodes:
        if node.op in ("call_module", "call_function"):
            groups.setdefault(find(node), []).append(node)
    out = []
    for members in groups.values():
        member_set = set(members)
        producers, consumers, ok = [], [], True
        for m in members:
            if g.is_add(m):
                ok = all(a in member_set for a in m.args)
            else:
                prod = g.producer(m)
                ok = prod is not None and prod[0] not in taken and (prod[1] is None or prod[1] not in taken)
                if ok:
                    producers.append(prod)
            for user in m.users:
                if user in member_set and g.is_add(user):
                    continue
                conv = g.dense_conv(user)
                if conv is None:
                    ok = False
                    break
                consumers.append(conv)
            if not ok:
                break
        if ok and producers and consumers:
            out.append((members, producers, consumers))
    return out


def _channel_range(gm: Any, nodes: list[Any], x: Any, batch: int) -> dict[Any, tuple[Any, Any]]:
    """Per-channel (min, max) (dim 1) of each of ``nodes`` over ``x``."""
    import torch.fx as fx

    want = set(nodes)
    seen: dict[Any, tuple[Any, Any]] = {}

    class Recorder(fx.Interpreter):
        def run_node(self, n: Any) -> Any:
            value = super().run_node(n)
            if n in want:
                flat = value.detach().transpose(0, 1).reshape(value.shape[1], -1)
                lo, hi = flat.amin(1), flat.amax(1)
                seen[n] = (lo, hi) if n not in seen else (torch.minimum(seen[n][0], lo), torch.maximum(seen[n][1], hi))
            return value

    with torch.no_grad():
        for i in range(0, len(x), batch):
            Recorder(gm).run(x[i : i + batch])
    return seen


def _live_ratio(num: Any, den: Any) -> Any:
    ok = (num > LIVE * num.max()) & (den > LIVE * den.max())
    return torch.where(ok, num / den.clamp_min(1e-30), torch.ones_like(num)).clamp(1 / LIMIT, LIMIT)


def _raise_to_common(zmax: Any, kind: str) -> Any:
    """Per-channel factors (>= 1) that raise each channel's calibration maximum to the common one, for a conv whose
    output ``zmax`` (max of the pre-activation, per channel) goes through ``kind``.

    ReLU is positively homogeneous, so any factor is exact. ReLU6 stays ReLU6 (no new op, still fused into the
    convolution): a channel that reaches 6 on the calibration set keeps factor 1, and every other channel is raised
    to 6 (or to the largest maximum when none reaches it), so its clip at 6 falls at its own calibration maximum:
    exact on everything calibration saw, a per-channel clip above it.
    """
    top = 6.0 if kind == "relu6" and float(zmax.max()) >= 6.0 else float(zmax.max())
    s = _live_ratio(torch.full_like(zmax, top), zmax).clamp_min(1.0)
    if kind == "relu6":
        s = torch.where(zmax >= 6.0, torch.ones_like(s), s)
    return s


def applicable(module: Any) -> bool:
    """Whether ``module`` has Conv2d modules to rewrite (an ExportedProgram's or TorchScript file's module keeps only
    its graph, and a model without convolutions has nothing to equalize)."""
    return any(isinstance(m, nn.Conv2d) for m in module.modules())


def equalize(
    module: Any, calib: np.ndarray, alpha: float = ALPHA, batch: int = 32, smooth_streams: bool = True
) -> tuple[Any, dict[str, Any]]:
    """A rewritten copy of ``module`` (which takes ``calib`` as it is) and a summary for the report; (None, summary
    with ``why``) when nothing applies or the rewrite would change the float model's outputs."""
    import torch.fx as fx

    start = time.perf_counter()
    if not applicable(module):
        return None, {"applied": False, "why": "no Conv2d modules to rewrite (an ExportedProgram or TorchScript file keeps only its graph)"}
    try:
        model = copy.deepcopy(module).eval()
        gm = fx.GraphModule(model, _tracer().trace(model))
    except Exception as exc:  # dynamic control flow, TorchScript, ...: the model is quantized as it is
        return None, {"applied": False, "why": f"torch.fx cannot trace the model ({type(exc).__name__}: {str(exc)[:200]})"}
    g = _Graph(gm)
    pairs = _depthwise_pairs(g)
    taken = {m for _, prod, dw, _ in pairs for m in (*prod, dw) if m is not None}
    streams = _streams(g, taken) if smooth_streams else []
    if not pairs and not streams:
        return None, {"applied": False, "why": "no conv+ReLU -> depthwise chain and no conv-only stream to equalize"}
    x = torch.from_numpy(np.ascontiguousarray(calib, dtype=np.float32))
    stats = _channel_range(gm, [p[0].args[0] for p in pairs] + [m for members, _, _ in streams for m in members], x, batch)
    for node, (conv, bn), dw, kind in pairs:
        s_c = _raise_to_common(stats[node.args[0]][1].clamp_min(0.0), kind)
        _scale_out(conv, bn, s_c)
        dw.weight.data /= s_c.reshape(-1, 1, 1, 1)
    for members, producers, consumers in streams:
        xmax = torch.stack([torch.maximum(-stats[m][0], stats[m][1]) for m in members]).amax(0)
        # each consumer row is quantized against its own largest weight: compare columns within rows
        rel = torch.stack(
            [
                (c.weight.detach().abs() / c.weight.detach().abs().amax(dim=(1, 2, 3), keepdim=True).clamp_min(1e-30)).amax(dim=(0, 2, 3))
                for c in consumers
            ]
        ).amax(0)
        s = _live_ratio(xmax**alpha, rel ** (1 - alpha))
        for conv, bn in producers:
            _scale_out(conv, bn, 1 / s)
        for c in consumers:
            c.weight.data *= s.reshape(1, -1, 1, 1)
    gm.graph.lint()
    gm.recompile()
    summary = {
        "applied": True,
        "depthwise_pairs": len(pairs),
        "streams": len(streams),
        "alpha": alpha if streams else None,
        "seconds": round(time.perf_counter() - start, 1),
    }
    why = _verify(module, gm, x[:VERIFY_SAMPLES])
    if why:
        log.warning("activation equalization dropped: %s", why)
        return None, {"applied": False, "why": why}
    return gm, summary


def _verify(module: Any, gm: Any, x: Any) -> str | None:
    with torch.no_grad():
        ref, got = module(x), gm(x)
    err = float((ref - got).abs().max())
    scale = float(ref.abs().max()) or 1.0
    if not err <= TOLERANCE * scale:
        return f"the rewritten model's outputs moved by {err:.3g} (of {scale:.3g}); a pattern was not what it seemed"
    return None
