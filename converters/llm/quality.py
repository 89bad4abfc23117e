"""How much a quantized GGUF differs from its F16 original, measured with llama.cpp.

Both models are loaded side by side and run over the same token windows of an
evaluation text (tokenized once, by the F16 model). Within a window of ``ctx``
tokens every position predicts the next token; for each we compute, from the
full next-token distributions (natural log, nats):

* NLL of the true next token under each model -> perplexity = exp(mean NLL);
* KL(P_f16 || P_quant) = sum_v P_f16(v) (log P_f16(v) - log P_quant(v));
* whether both models' most likely token is the same (top-1 agreement).

Each window starts with BOS when the model adds one. Memory: both models'
weights plus, per model, three ``ctx x n_vocab`` float32 tables (llama.cpp's
output buffer, llama-cpp-python's scores, our copy): 940 MiB peak for SmolLM2
(49k vocabulary) at ctx 256. The softmaxes are taken in blocks of rows so that
no ``ctx x n_vocab`` float64 table is made.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from converters.llm.native_log import native_output_to_log
from converters.llm.progress import Progress
from runtime.classify.preprocess import log_softmax
from runtime.errors import BackendError, BadInput, missing

log = logging.getLogger(__name__)
ROW_BLOCK = 32  # rows of logits turned into float64 log-probs at a time
DEFAULT_TEXT = Path(__file__).resolve().parent.parent / "data" / "eval.txt"


@dataclass
class QualityReport:
    quant: str
    tokens: int  # scored next-token predictions
    ctx: int  # tokens per window
    ppl_f16: float
    ppl_quant: float
    kl_mean: float  # nats
    kl_p99: float  # nats
    kl_max: float  # nats
    top1_agreement: float  # fraction of positions, 0..1
    eval_text_sha256: str
    max_kl: float | None = None  # the gate applied to kl_mean
    passed: bool | None = None
    kl_per_token: list[float] = field(default_factory=list, repr=False)  # for the plot; not in the manifest

    def summary(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("kl_per_token")
        return {k: float(f"{v:.6g}") if isinstance(v, float) else v for k, v in data.items()}  # 6 significant digits


def _open(path: Path, ctx: int, threads: int) -> Any:
    try:
        from llama_cpp import Llama
    except ImportError as exc:
        raise missing("llama_cpp", "llm") from exc
    try:
        return Llama(str(path), n_ctx=ctx, n_batch=ctx, n_ubatch=ctx, n_threads=threads, n_threads_batch=threads,
                     logits_all=True, verbose=False)
    except (ValueError, RuntimeError) as exc:
        raise BackendError(f"llama.cpp could not load {path}: {exc}") from None


def score_window(ref: np.ndarray, test: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per position: (NLL ref, NLL test, KL(ref || test), top-1 equal) for logits rows and their next tokens."""
    nll_r, nll_t, kl, same = [], [], [], []
    for s in range(0, len(targets), ROW_BLOCK):
        lr, lt, tg = log_softmax(ref[s:s + ROW_BLOCK]), log_softmax(test[s:s + ROW_BLOCK]), targets[s:s + ROW_BLOCK]
        rows = np.arange(len(tg))
        nll_r.append(-lr[rows, tg])
        nll_t.append(-lt[rows, tg])
        kl.append(np.maximum((np.exp(lr) * (lr - lt)).sum(axis=-1), 0.0))  # >= 0 up to rounding
        same.append(lr.argmax(axis=-1) == lt.argmax(axis=-1))
    return np.concatenate(nll_r), np.concatenate(nll_t), np.concatenate(kl), np.concatenate(same)


def evaluate(f16: Path, quant_path: Path, quant: str, text: str, *, ctx: int = 256, max_tokens: int = 4096,
             threads: int = 2, progress: bool | None = None) -> QualityReport:
    """Measure ``quant_path`` against ``f16`` over ``text`` (see the module docstring)."""
    with native_output_to_log() as terminal:
        return _measure(f16, quant_path, quant, text, ctx, max_tokens, threads, Progress(
            "evaluate", 1, enabled=progress, stream=terminal))


def _measure(f16: Path, quant_path: Path, quant: str, text: str, ctx: int, max_tokens: int, threads: int,
             bar: Progress) -> QualityReport:
    ref = _open(f16, ctx, threads)
    try:
        test = ref if quant_path == f16 else _open(quant_path, ctx, threads)
        try:
            ids = ref.tokenize(text.encode("utf-8"), add_bos=False, special=False)[:max_tokens]
            bos = ref.tokenize(b"", add_bos=True, special=False)  # [bos] when the model adds one, else []
            step = ctx - len(bos)
            if len(ids) < 2:
                raise BadInput(f"the evaluation text gives {len(ids)} token(s); at least 2 are needed")
            windows = [bos + ids[i:i + step] for i in range(0, len(ids) - 1, step)]
            windows = [w for w in windows if len(w) - len(bos) >= 2]
            parts: list[tuple[np.ndarray, ...]] = []
            bar.total = len(windows)
            with bar:
                for w in windows:
                    logits = []
                    for llm in (ref, test):
                        llm.reset()
                        llm.eval(w)
                        logits.append(np.array(llm.scores[: len(w) - 1], dtype=np.float32))
                    parts.append(score_window(logits[0], logits[1], np.asarray(w[1:])))
                    bar.advance()
        finally:
            if test is not ref:
                test.close()
    finally:
        ref.close()
    nll_r, nll_t, kl, same = (np.concatenate(p) for p in zip(*parts, strict=True))
    return QualityReport(
        quant=quant, tokens=int(len(kl)), ctx=ctx,
        ppl_f16=float(np.exp(nll_r.mean())), ppl_quant=float(np.exp(nll_t.mean())),
        kl_mean=float(kl.mean()), kl_p99=float(np.percentile(kl, 99)), kl_max=float(kl.max()),
        top1_agreement=float(same.mean()),
        eval_text_sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
        kl_per_token=[float(v) for v in kl],
    )


def require_plotting() -> None:
    """Fail before any work when the plot cannot be drawn (MissingDependency with the pip line)."""
    if importlib.util.find_spec("matplotlib") is None:  # also None when sys.modules marks it absent
        raise missing("matplotlib", "convert")


def plot_kl(report: QualityReport, out: Path) -> None:
    """A small PNG histogram of the per-token KL divergence (log-scaled x axis)."""
    require_plotting()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    kl = np.asarray(report.kl_per_token)
    fig, ax = plt.subplots(figsize=(4.8, 2.8), dpi=80)
    try:
        floor = 1e-6
        bins = np.logspace(np.log10(floor), np.log10(max(kl.max(), floor * 10)), 40)
        ax.hist(np.maximum(kl, floor), bins=bins, color="#4477aa")
        ax.set_xscale("log")
        ax.axvline(report.kl_mean, color="k", lw=1, label=f"mean {report.kl_mean:.4f}")
        ax.axvline(report.kl_p99, color="r", lw=1, ls="--", label=f"p99 {report.kl_p99:.4f}")
        ax.set_xlabel("KL(F16 || quant) per token, nats")
        ax.set_ylabel("tokens")
        ax.set_title(f"{report.quant}: {report.tokens} tokens, top-1 {100 * report.top1_agreement:.1f}%", fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out, format="png")
    finally:
        plt.close(fig)
