"""Placement: resolve a requested target (cpu, gpu, npu, auto) to a concrete backend configuration.

The resolution walks an explicit chain: the requested target, or for ``auto``
the board profile's preferred targets, then the CPU. Every step that cannot be
honoured adds one human line to ``Placement.fallback`` saying why and what it
does instead, so a fallback is always reported, never silent. With
``require_accelerator`` a chain that ends on the CPU raises
:class:`~runtime.errors.PlacementError` carrying those lines instead.

After the backend loads, the runtime attaches what actually happened, as the
backend itself reports it (:class:`~runtime.backends.base.Offload`: the layers llama.cpp placed per
device, the nodes ORT assigned per provider, the ops each LiteRT delegate took)
with :meth:`Placement.loaded`, and prints :meth:`Placement.summary`. An
accelerator that took none of the model (an Edge TPU given a model
edgetpu_compiler never saw) is a fallback to the CPU, reported as such and
refused under ``require_accelerator``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

from devices.accelerators import AcceleratorKind
from devices.backends import BACKENDS, BackendName
from devices.capabilities import GPU_PROVIDERS, NPU_PROVIDERS, BackendCaps, probe
from devices.cpu import GGML_MAX_N_THREADS, CpuInfo, max_threads, read_cpu
from devices.machine import Machine, detect
from devices.rootfs import RootFS
from devices.target import Target
from runtime.errors import BadInput, MissingDependency, PlacementError

__all__ = ["OffloadReport", "Placement", "Target", "resolve_placement", "cpu_placement", "ALL_LAYERS"]

# llama.cpp clamps n_gpu_layers to the model's layer count; this asks for "all" when
# the count is not known yet.
ALL_LAYERS = 999
CUDA_KINDS = (AcceleratorKind.NVIDIA_GPU, AcceleratorKind.JETSON_GPU)
EDGETPU_KINDS = (AcceleratorKind.EDGETPU_USB, AcceleratorKind.EDGETPU_PCIE)
CUDA_BUILD = f"build with {BACKENDS[BackendName.LLAMACPP].gpu_build}"
EDGETPU_RUNTIME = "install the Edge TPU runtime: apt-get install libedgetpu1-std (from the Coral apt repository)"


class OffloadReport(Protocol):
    """What a loaded backend reports it put where (:class:`runtime.backends.base.Offload`), as placement reads it.

    The backend is told its placement and reports back; devices/ never imports the backends."""

    @property
    def unit(self) -> str: ...
    @property
    def on_accelerator(self) -> int | None: ...
    @property
    def total(self) -> int: ...
    @property
    def why(self) -> str | None: ...
    def describe(self) -> str: ...
    def to_dict(self) -> dict[str, object]: ...


@dataclass(frozen=True)
class Placement:
    backend: str  # a devices.backends.BackendName value
    requested: Target
    target: Target  # what it resolved to: cpu, gpu or npu
    device: str  # "cpu", "cuda:0", "edgetpu:usb", "npu"
    threads: int  # CPU threads for the backend (llama.cpp n_threads, LiteRT/ORT intra-op)
    gpu_layers: int  # llama.cpp n_gpu_layers; 0 on CPU
    delegate: str | None  # LiteRT delegate library, None for the built-in CPU (XNNPACK) path
    providers: tuple[str, ...]  # ORT execution providers, in order; () for other backends
    fallback: tuple[str, ...]  # one line per fallback step, empty when the request was honoured
    cpu: CpuInfo  # the CPU it runs on: its features choose kernels (ORT's exact INT8 ones on x86 without VNNI)
    notes: tuple[str, ...] = ()  # other decisions worth reporting (threads reduced for load)
    offload: OffloadReport | None = None  # filled in after load by the runtime
    # These threads and the busy ones (the load average's, a resident llama.cpp model's) are more than the usable
    # cores: threads that spin while waiting would take time from the other work (see resolve_placement).
    shares_cores: bool = False

    @property
    def fell_back(self) -> bool:
        return bool(self.fallback)

    def loaded(self, offload: OffloadReport, *, require_accelerator: bool = False) -> "Placement":
        """This placement with what the backend reports it put where.

        An accelerator that took none of the model runs nothing: the placement then says the model runs on
        the CPU and why, and ``require_accelerator`` refuses it (:class:`PlacementError`). An offload the backend
        did not report is kept as unmeasured, and the summary says so."""
        if self.target is Target.CPU or offload.on_accelerator is None or offload.on_accelerator > 0:
            return dataclasses.replace(self, offload=offload)
        line = f"{self.device}: the accelerator took none of the model's {offload.total} {offload.unit}"
        line += f" ({offload.why})" if offload.why else ""
        if require_accelerator:
            raise PlacementError(f"--require-accelerator: {line}")
        return dataclasses.replace(
            self, target=Target.CPU, device="cpu", offload=offload, fallback=(*self.fallback, f"{line}; running on cpu")
        )

    def summary(self) -> str:
        parts = [f"{self.backend} on {self.device}", f"{self.threads} thread{'s' if self.threads != 1 else ''}"]
        if self.backend == BackendName.LLAMACPP.value and self.target is Target.GPU:
            parts.append(f"gpu_layers={self.gpu_layers}")
        if self.delegate:
            parts.append(f"delegate {self.delegate}")
        if self.providers:
            parts.append("providers " + ",".join(self.providers))
        if self.offload:
            parts.append(self.offload.describe())
        line = "placement: " + ", ".join(parts) + f" (requested {self.requested.value})"
        if self.fallback:
            line += "; fallback: " + " | ".join(self.fallback)
        if self.notes:
            line += "; " + " | ".join(self.notes)
        return line

    def to_dict(self) -> dict[str, object]:
        return {
            "backend": self.backend,
            "requested": self.requested.value,
            "target": self.target.value,
            "device": self.device,
            "threads": self.threads,
            "gpu_layers": self.gpu_layers,
            "delegate": self.delegate,
            "providers": list(self.providers),
            "fallback": list(self.fallback),
            "notes": list(self.notes),
            "offload": self.offload.to_dict() if self.offload else None,
            "shares_cores": self.shares_cores,
        }


@dataclass(frozen=True)
class _Step:
    device: str
    gpu_layers: int = 0
    delegate: str | None = None
    providers: tuple[str, ...] = ()


def resolve_placement(
    backend: BackendName | str,
    target: Target | str = "auto",
    *,
    require_accelerator: bool = False,
    threads: int | None = None,
    n_layers: int | None = None,
    int8: bool = False,
    busy_threads: int = 0,
    machine: Machine | None = None,
    caps: BackendCaps | None = None,
) -> Placement:
    """Resolve ``target`` for ``backend`` on ``machine`` (default: this one) with ``caps`` (default: probed now).

    ``int8``: the model computes in 8-bit integers; on a CPU without 8-bit dot-product instructions the
    placement then says that INT8 will not be faster than float there.
    ``busy_threads``: threads other engines in this process already run (a resident llama.cpp model's),
    counted as busy cores beside the load average."""
    kind = BackendName.parse(backend)
    requested = Target.parse(target)
    if require_accelerator and requested is Target.CPU:
        raise BadInput("--require-accelerator contradicts --target cpu; use --target gpu, npu or auto")
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
        raise BadInput(f"threads={threads!r} is invalid; give a positive integer")
    if n_layers is not None and (not isinstance(n_layers, int) or n_layers < 0):
        raise BadInput(f"n_layers={n_layers!r} is invalid; give the model's layer count (>= 0)")
    if not isinstance(busy_threads, int) or isinstance(busy_threads, bool) or busy_threads < 0:
        raise BadInput(f"busy_threads={busy_threads!r} is invalid; give the threads other engines run (>= 0)")
    machine = machine or detect("/")
    if threads is not None and threads > max_threads(machine.cpu.logical_cpus):
        # thousands of threads make libgomp fail inside llama.cpp and ONNX Runtime's pool hang at start
        raise BadInput(
            f"threads={threads} is invalid; give an integer from 1 to {max_threads(machine.cpu.logical_cpus)} "
            f"(4 x the {machine.cpu.logical_cpus} logical CPUs, at most {GGML_MAX_N_THREADS})"
        )
    caps = caps or probe(kind)
    if not caps.installed:
        why = f" ({caps.error})" if caps.error else ""
        raise MissingDependency(
            f"the {kind.value} backend's package {caps.module!r} cannot be imported{why}; install it with: {caps.install}"
        )

    chain = [requested] if requested is not Target.AUTO else [t for t in machine.profile.preferred_targets if t is not Target.CPU]
    fallback: list[str] = []
    failures: list[tuple[Target, str]] = []
    chosen: tuple[Target, _Step] | None = None
    for step_target in chain:
        step, reason = _try(kind, step_target, machine, caps, n_layers)
        if step is not None:
            chosen = (step_target, step)
            break
        failures.append((step_target, reason))
    for i, (failed, reason) in enumerate(failures):
        then = (
            "using cpu"
            if chosen is None and i == len(failures) - 1
            else f"trying {(failures[i + 1][0] if i + 1 < len(failures) else chosen[0]).value}"
        )
        label = "requested" if requested is not Target.AUTO else "(auto)"
        fallback.append(f"{failed.value} {label}: {reason}; {then}")
    if chosen is None:
        if require_accelerator:
            reasons = "; ".join(f"{t.value}: {r}" for t, r in failures) or "the profile prefers no accelerator"
            raise PlacementError(f"--require-accelerator: {kind.value} would run on the CPU ({reasons})")
        chosen = (Target.CPU, _Step(device="cpu", providers=("CPUExecutionProvider",) if kind is BackendName.ORT else ()))
    busy = int(machine.live.load_avg[0] + 0.5) + busy_threads  # cores other work occupies
    n_threads, notes = _threads(machine, threads, busy)
    # Idle threads may spin only when ours and the busy ones fit on the usable cores together. ``busy`` already
    # counts a resident llama.cpp model's threads beside the load average, so no term is added for them here.
    # When _threads cut our threads to the free cores, they fit and spinning takes time from nobody; they do
    # not fit when the user asked for more threads than are free, or when even the one thread left shares a core
    # (busy >= usable). A busy core alone is no reason: the load average also counts edgerun's own recent work.
    shares_cores = n_threads + busy > machine.usable_cpus
    resolved, step = chosen
    if int8 and resolved is Target.CPU and not machine.cpu.int8_dot:
        notes.append(
            f"INT8 about as fast as float here: {machine.cpu.arch} CPU without 8-bit dot-product instructions (x86 VNNI, ARM dotprod)"
        )
    return Placement(
        backend=kind.value,
        requested=requested,
        target=resolved,
        device=step.device,
        threads=n_threads,
        gpu_layers=step.gpu_layers,
        delegate=step.delegate,
        providers=step.providers,
        fallback=tuple(fallback),
        cpu=machine.cpu,
        notes=tuple(notes),
        shares_cores=shares_cores,
    )


def cpu_placement(backend: BackendName | str, threads: int = 1, *, shares_cores: bool = False,
                  cpu: CpuInfo | None = None) -> Placement:
    """``backend`` on the CPU with ``threads``, outside the resolve chain: what a conversion gate or a test runs a
    model with where it is, and the audio front end beside a placed classifier. ``cpu``: default this machine's."""
    kind = BackendName.parse(backend)
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise BadInput(f"threads={threads!r} is invalid; give a positive integer")
    return Placement(
        backend=kind.value, requested=Target.CPU, target=Target.CPU, device="cpu", threads=threads, gpu_layers=0,
        delegate=None, providers=("CPUExecutionProvider",) if kind is BackendName.ORT else (), fallback=(),
        cpu=cpu or read_cpu(RootFS.at("/")), shares_cores=shares_cores,
    )


def _try(kind: BackendName, target: Target, machine: Machine, caps: BackendCaps, n_layers: int | None) -> tuple[_Step | None, str]:
    """A configuration for ``target``, or None and the reason in words."""
    if target is Target.CPU:
        return _Step(device="cpu"), ""
    entry = BACKENDS[kind]
    if not entry.takes(target):
        if entry.targets == (Target.CPU,):
            return None, f"the {entry.title} runs on the CPU only"
        return None, f"{entry.title} has no {target.value.upper()} backend"
    hardware = machine.accelerators_for(target)
    if kind is BackendName.LLAMACPP:
        cuda = [a for a in hardware if a.kind in CUDA_KINDS]
        if not hardware:
            extra = "" if caps.gpu else ", and llama.cpp in this install was built without GPU offload"
            return None, f"this machine has no GPU{extra}"
        if not caps.gpu:
            return None, f"llama.cpp in this install was built without GPU offload ({CUDA_BUILD})"
        device = "cuda:0" if cuda else f"gpu:0 ({hardware[0].name})"
        return _Step(device=device, gpu_layers=n_layers + 1 if n_layers is not None else ALL_LAYERS), ""
    if kind is BackendName.LITERT:
        if target is Target.GPU:
            if not hardware:
                return None, "this machine has no GPU"
            if not caps.gpu:
                return None, "the LiteRT GPU delegate (libtensorflowlite_gpu_delegate.so) is not installed"
            return _Step(device="gpu:0", delegate="libtensorflowlite_gpu_delegate.so"), ""
        tpus = [a for a in hardware if a.kind in EDGETPU_KINDS]
        if not tpus:
            other = ", ".join(a.name for a in hardware)
            return None, f"LiteRT cannot drive {other}" if other else "this machine has no Edge TPU (or other NPU LiteRT can use)"
        usable = [a for a in tpus if a.problem is None]
        if not usable:
            return None, tpus[0].problem or "the Edge TPU is not usable"
        if not caps.npu:
            return None, f"the Edge TPU is present but libedgetpu.so.1 does not load ({EDGETPU_RUNTIME})"
        bus = "usb" if usable[0].kind is AcceleratorKind.EDGETPU_USB else "pci"
        return _Step(device=f"edgetpu:{bus}", delegate="libedgetpu.so.1"), ""
    # ONNX Runtime
    wanted = GPU_PROVIDERS if target is Target.GPU else NPU_PROVIDERS
    present = tuple(p for p in caps.providers if p in wanted)
    if not hardware:
        return None, f"this machine has no {target.value.upper()}"
    if not present:
        fix = (
            "pip install onnxruntime-gpu for CUDAExecutionProvider"
            if target is Target.GPU
            else "pip install onnxruntime-openvino for OpenVINOExecutionProvider"
        )
        return None, f"onnxruntime here offers {', '.join(caps.providers) or 'no providers'}, none for the {target.value.upper()} ({fix})"
    device = "cuda:0" if target is Target.GPU else hardware[0].kind.value
    return _Step(device=device, providers=(*present, "CPUExecutionProvider")), ""


def _threads(machine: Machine, requested: int | None, busy: int) -> tuple[int, list[str]]:
    """The profile's thread count, reduced when other work already occupies cores.

    llama.cpp's worker threads spin while waiting for each other; when they share
    cores with other busy processes, a thread that is descheduled stalls all the
    others, and decode speed collapses rather than degrading gently. So we leave
    the cores that are busy (``busy``: the 1-minute load average, and other engines' threads).
    """
    if requested is not None:
        return requested, []
    wanted = machine.profile_threads()
    free = max(1, machine.usable_cpus - busy)
    if free < wanted:
        return free, [
            f"threads reduced from {wanted} to {free}: {busy} cores busy (load average {machine.live.load_avg[0]:.2f}) "
            f"on {machine.usable_cpus} usable CPUs"
        ]
    return wanted, []
