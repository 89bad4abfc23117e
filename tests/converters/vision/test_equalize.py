"""Activation equalization (converters.vision.equalize): which patterns it rewrites, that the float model keeps
its outputs, that per-tensor INT8 of the rewritten activations loses less, and that it refuses what it cannot do."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from converters.vision import equalize as eq  # noqa: E402
from converters.vision.mobilenet_v2 import MobileNetV2  # noqa: E402


def _uneven_mobilenet(seed: int = 0) -> tuple[nn.Module, np.ndarray, np.ndarray]:
    """A narrow MobileNetV2 (full depth) with random weights, BatchNorm scales spread over two decades so channel
    ranges differ the way trained ones do, and BatchNorm statistics warmed on the data (else ranges mean nothing).
    Returns the model and a calibration and a held-out batch (N, 3, 32, 32)."""
    torch.manual_seed(seed)
    model = MobileNetV2(num_classes=10, width=0.25)
    gen = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.weight.data = 10 ** (torch.rand(m.num_features, generator=gen) * 2.5 - 2.0)
            m.bias.data = torch.randn(m.num_features, generator=gen) * 0.1
    x = torch.randn(96, 3, 32, 32, generator=gen)
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(x[:64])
    model.eval()
    return model, x[:64].numpy(), x[64:].numpy()


def _relu6_inputs_of_depthwise(model: nn.Module) -> list[nn.Module]:
    """The expansion ReLU6 modules (their output feeds a depthwise convolution only)."""
    return [b.conv[0][2] for b in model.features[1:18] if len(b.conv) == 4]


def _outputs_of(model: nn.Module, modules: list[nn.Module], x: np.ndarray) -> list[torch.Tensor]:
    got: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda _m, _i, o: got.append(o.detach().clone())) for m in modules]
    with torch.no_grad():
        model(torch.from_numpy(x))
    for h in hooks:
        h.remove()
    return got


def test_mobilenet_patterns_are_found_and_the_float_model_keeps_its_outputs() -> None:
    model, cal, held = _uneven_mobilenet()
    rewritten, summary = eq.equalize(model, cal)
    assert rewritten is not None and summary["applied"]
    # 16 expansion convolutions feed depthwise ones. The stem does too, but at this width block 1 keeps 8
    # channels and adds the stem's output back (a residual): that ReLU6 output is read twice and stays as it is.
    assert summary["depthwise_pairs"] == 16
    # one stream per stage but the first, whose residual sum includes that ReLU6 output (not a conv's)
    assert summary["streams"] == 6
    with torch.no_grad():
        ref, got = model(torch.from_numpy(cal)), rewritten(torch.from_numpy(cal))
        assert float((ref - got).abs().max()) < 1e-3 * float(ref.abs().max())  # exact where calibration looked
        ref_h, got_h = model(torch.from_numpy(held)), rewritten(torch.from_numpy(held))
    cos = torch.nn.functional.cosine_similarity(ref_h, got_h, dim=1)
    assert float(cos.min()) > 0.999  # and essentially so on data it did not see
    # the source module is untouched
    assert model.features[0][1].weight.data.max() <= 10**0.5 + 1e-6


def test_per_tensor_int8_of_the_depthwise_inputs_loses_less() -> None:
    model, cal, held = _uneven_mobilenet(1)
    rewritten, _ = eq.equalize(model, cal, smooth_streams=False)
    before = _outputs_of(model, _relu6_inputs_of_depthwise(model), held)
    # in the traced copy the same ReLU6 modules sit at the same qualified names
    names = [f"features.{i}.conv.0.2" for i in range(1, 18) if len(model.features[i].conv) == 4]
    after = _outputs_of(rewritten, [rewritten.get_submodule(n) for n in names], held)

    def worst_channels_sqnr(t: torch.Tensor) -> float:
        """dB of signal over per-tensor INT8 error (one range, as TFLite and ORT give an activation), channel by
        channel against each channel's own size; the 10th percentile over the channels that carry signal."""
        scale = float(t.max()) / 255
        q = torch.round(t / scale).clamp(0, 255) * scale
        err, sig = ((q - t) ** 2).mean(dim=(0, 2, 3)), (t**2).mean(dim=(0, 2, 3))
        live = sig > 0
        return float(torch.quantile(10 * torch.log10(sig[live] / err[live].clamp_min(1e-20)), 0.1))

    gains = [worst_channels_sqnr(a) - worst_channels_sqnr(b) for a, b in zip(after, before, strict=True)]
    assert min(gains) > 0 and np.median(gains) > 12  # every tensor better, the typical one by 2+ bits
    spread = []
    for t in after:
        m = t.amax(dim=(0, 2, 3))
        live = m[m > 1e-2 * m.max()]
        spread.append(float(live.max() / live.min()))
    assert np.median(spread) < 4  # channel maxima are close after (held-out data: not exactly equal)


def test_a_relu_output_read_elsewhere_is_not_rescaled() -> None:
    class Tapped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.bn, self.act = nn.Conv2d(3, 8, 1), nn.BatchNorm2d(8), nn.ReLU()
            self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.act(self.bn(self.conv(x)))
            return self.dw(y).mean((2, 3)) + y.mean((2, 3))  # y is read twice: scaling it would change the sum

    model = Tapped().eval()
    model.bn.weight.data = torch.logspace(-2, 0, 8)
    rewritten, summary = eq.equalize(model, np.random.default_rng(0).normal(size=(8, 3, 8, 8)).astype(np.float32))
    assert rewritten is None and not summary["applied"] and "no conv+ReLU" in summary["why"]


def test_an_untraceable_model_is_quantized_as_it_is() -> None:
    class Branchy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x) if x.sum() > 0 else -self.conv(x)  # data-dependent: torch.fx cannot follow it

    rewritten, summary = eq.equalize(Branchy().eval(), np.ones((2, 3, 4, 4), np.float32))
    assert rewritten is None and "torch.fx cannot trace" in summary["why"]


def test_a_rewrite_that_changes_the_outputs_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    model, cal, _ = _uneven_mobilenet(2)
    real = eq._scale_out
    monkeypatch.setattr(eq, "_scale_out", lambda conv, bn, s: real(conv, bn, s * s))  # a wrong factor
    rewritten, summary = eq.equalize(model, cal)
    assert rewritten is None and not summary["applied"] and "outputs moved" in summary["why"]


def test_a_graph_only_module_says_so() -> None:
    # an ExportedProgram's module keeps its weights as graph constants: no Conv2d modules to rescale
    model = nn.Sequential(nn.Conv2d(3, 8, 1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1, groups=8)).eval()
    x = torch.randn(1, 3, 8, 8)
    rewritten, summary = eq.equalize(torch.export.export(model, (x,)).module(), x.numpy())
    assert rewritten is None and "graph" in summary["why"]
    rewritten, summary = eq.equalize(model, torch.randn(16, 3, 8, 8).numpy())  # the module itself has the pattern
    assert rewritten is not None and summary["depthwise_pairs"] == 1 and summary["alpha"] is None
