"""HF checkpoint -> F16 GGUF -> quantized GGUF -> quality report -> bundle, all or nothing.

Every input check (config, weights, shapes, tokenizer, output path, evaluation
text) runs before anything is written. All work happens in a hidden temporary
directory next to the output, which is renamed into place (a bundle directory)
or packed atomically (a ``.edgerun`` file) only after the quality gate passed;
on any failure, including Ctrl-C, the temporary directory is removed.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from converters.llm.checkpoint import HFCheckpoint
from converters.llm.gguf_export import write_gguf
from converters.llm.loadcheck import check_loads
from converters.llm.options import ConvertOptions, Quant
from converters.llm.quality import DEFAULT_TEXT, QualityReport, evaluate, plot_kl, require_plotting
from converters.llm.quantize import quantize
from runtime.bundle.manifest import FileEntry, Manifest, check_name, check_version, name_from
from runtime.bundle.recipes import WEIGHTS_FILE, llm_manifest
from runtime.bundle.store import publish
from runtime.errors import BadInput, QualityGateFailed
from runtime.files import sha256_file
from runtime.formats.gguf_file import read_gguf

log = logging.getLogger(__name__)
REPORT_FILE = "quality.json"
PLOT_FILE = "quality-kl.png"


@dataclass
class Conversion:
    out: Path
    manifest: Manifest
    report: QualityReport
    stages: dict[str, float] = field(default_factory=dict)  # stage -> wall seconds


def default_name(checkpoint: Path) -> str:
    return name_from(checkpoint.resolve().name)


def _check_output(out: Path) -> None:
    if out.exists() or out.is_symlink():
        raise BadInput(f"{out} already exists; choose another output path or remove it")
    if not out.parent.is_dir():
        raise BadInput(f"{out.parent}: the output's directory does not exist")


def _read_text(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: evaluation text is not readable UTF-8 ({exc})"[:300]) from None
    if not text.strip():
        raise BadInput(f"{path}: evaluation text is empty")
    return text


def convert(opts: ConvertOptions) -> Conversion:
    opts.check()
    out = Path(opts.out)
    _check_output(out)
    name = check_name(opts.name or default_name(opts.checkpoint))
    version = check_version(opts.version or opts.quant.value)
    text = _read_text(opts.eval_text or DEFAULT_TEXT)
    require_plotting()
    stages: dict[str, float] = {}
    work = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    try:
        staging = work / "bundle"
        staging.mkdir()
        weights = staging / WEIGHTS_FILE
        t0 = time.monotonic()
        with HFCheckpoint.open(opts.checkpoint) as ckpt:
            vocab = ckpt.vocab()
            f16 = weights if opts.quant in (Quant.F16, Quant.F32) else work / "model-f16.gguf"
            base = Quant.F32 if opts.quant == Quant.F32 else Quant.F16
            write_gguf(ckpt, vocab, f16, base, name=name, progress=opts.progress)
            arch = ckpt.arch.name
        check_loads(f16)
        stages["gguf"] = time.monotonic() - t0
        if f16 != weights:
            t0 = time.monotonic()
            quantize(f16, weights, opts.quant, threads=opts.threads, progress=opts.progress)
            stages["quantize"] = time.monotonic() - t0
        t0 = time.monotonic()
        report = evaluate(f16, weights, opts.quant.value, text, ctx=opts.eval_ctx, max_tokens=opts.eval_max_tokens,
                          threads=opts.threads, progress=opts.progress)
        stages["evaluate"] = time.monotonic() - t0
        report.max_kl, report.passed = opts.gate, report.kl_mean <= opts.gate
        if not report.passed:
            raise QualityGateFailed(
                f"{opts.quant.value}: mean KL(F16 || quant) {report.kl_mean:.4f} nats exceeds --max-kl {opts.gate}"
                f" (p99 {report.kl_p99:.4f}, top-1 {100 * report.top1_agreement:.1f}%); no bundle written")
        if f16 != weights:
            f16.unlink()  # free the disk before the transport copy
        manifest = _manifest(staging, name, version, opts, report, arch, stages)
        (staging / "manifest.json").write_bytes(manifest.to_json())
        _publish(staging, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log.info("wrote %s (%s)", out, manifest.ref)
    return Conversion(out, manifest, report, stages)


def _manifest(staging: Path, name: str, version: str, opts: ConvertOptions, report: QualityReport, arch: str,
              stages: dict[str, float]) -> Manifest:
    (staging / REPORT_FILE).write_text(json.dumps({**report.summary(), "kl_per_token": report.kl_per_token}) + "\n")
    plot_kl(report, staging / PLOT_FILE)
    entries = []
    for path, role in ((WEIGHTS_FILE, "weights"), (REPORT_FILE, "report"), (PLOT_FILE, "plot")):
        sha, size = sha256_file(staging / path)
        entries.append(FileEntry(path, sha, size, role))
    source = {"converter": "edgerun convert llm", "checkpoint": opts.checkpoint.resolve().name, "architecture": arch}
    manifest = llm_manifest(read_gguf(staging / WEIGHTS_FILE), name, version, entries[0], opts.license, source)
    reports = {"quality": report.summary(), "conversion_seconds": {k: round(v, 2) for k, v in stages.items()}}
    return dataclasses.replace(manifest, files=tuple(entries), reports=reports)


def _publish(staging: Path, out: Path) -> None:
    _check_output(out)  # again: something may have appeared while we worked
    publish(staging, out)
