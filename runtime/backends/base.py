"""The backend interface. Public behaviour lives in runtime/llm/model.py; a backend
implements only these primitives over its native handles.

A language-model backend holds one KV sequence whose cells are addressed by
position 0..n_ctx-1. The engine keeps the list of tokens in those cells and
asks the backend to decode, remove, shift, save and restore them.

A classifier backend (LiteRT, ONNX Runtime) runs one input tensor to one output
tensor; runtime/classify/classifier.py does the pre- and post-processing around it.

Every backend is built the same way, ``cls(path, plan, placement)`` (runtime.backends.open_backend, from the
one table devices.backends.BACKENDS): the model file, its memory plan (None where the backend sizes nothing by
it) and the resolved placement, which tells it its threads, GPU layers, delegate, execution providers and CPU.
A backend reads these from :class:`Placed`; it never reads the machine itself nor imports devices.placement.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from runtime.errors import BackendError, BadInput, EdgerunError, one_line
from runtime.llm.sampling import SamplingParams


class CpuFeatures(Protocol):
    """The CPU a backend runs on, as it reads it (devices.cpu.CpuInfo)."""

    @property
    def arch(self) -> str: ...  # "x86_64", "aarch64", ...
    @property
    def int8_dot(self) -> bool: ...  # 8-bit dot-product instructions (x86 VNNI, ARM dotprod)


class Placed(Protocol):
    """What a backend is told about where it runs: devices.placement.Placement, read structurally."""

    @property
    def threads(self) -> int: ...  # CPU threads: llama.cpp n_threads, LiteRT num_threads, ORT intra-op
    @property
    def gpu_layers(self) -> int: ...  # llama.cpp n_gpu_layers; 0 elsewhere
    @property
    def delegate(self) -> str | None: ...  # LiteRT delegate library; None for the built-in CPU path
    @property
    def providers(self) -> tuple[str, ...]: ...  # ORT execution providers, in order; () means the CPU's
    @property
    def shares_cores(self) -> bool: ...  # other work needs these cores: idle threads must not spin
    @property
    def cpu(self) -> CpuFeatures: ...


class ContextPlan(Protocol):
    """The llama.cpp context a backend is told to make: runtime.llm.plan.MemoryPlan, read structurally (the
    backends do not import the planner)."""

    @property
    def n_ctx(self) -> int: ...  # KV cells in all
    @property
    def n_batch(self) -> int: ...  # tokens per llama_decode call
    @property
    def n_ubatch(self) -> int: ...  # tokens per compute graph
    @property
    def kv_type(self) -> str: ...  # "f16", "q8_0", ...
    @property
    def n_slots(self) -> int: ...  # sequences decoded together
    @property
    def slot_ctx(self) -> int: ...  # cells per sequence


@dataclass(frozen=True)
class Offload:
    """What the loaded backend actually put where, in the backend's own unit, as the backend itself reports it.

    When the backend did not report it (llama.cpp's log gave the device of only some layers), ``on_accelerator``
    is None: the offload is unmeasured, and ``asked`` (what was asked for) and ``why`` say so; it is never
    filled in from the request."""

    unit: str  # "layers" (llama.cpp), "nodes" (ORT), "ops" (LiteRT)
    on_accelerator: int | None  # None: not reported by the backend
    total: int
    by_device: tuple[tuple[str, int], ...] = ()  # (device, count): llama.cpp device, ORT provider, LiteRT delegate
    why: str | None = None  # why nothing could go to the accelerator, or why the offload is not known
    asked: int | None = None  # how many were asked for the accelerator, reported beside an unmeasured offload

    @property
    def measured(self) -> bool:
        return self.on_accelerator is not None

    def to_dict(self) -> dict[str, object]:
        return {"unit": self.unit, "on_accelerator": self.on_accelerator, "total": self.total,
                "by_device": dict(self.by_device), "measured": self.measured, "why": self.why, "asked": self.asked}

    def describe(self) -> str:
        if not self.measured:
            asked = f"; asked for {self.asked} of the {self.total} {self.unit}" if self.asked is not None else ""
            return f"offload not reported ({self.why or 'the backend did not say'}){asked}"
        line = f"{self.on_accelerator}/{self.total} {self.unit} on the accelerator"
        if self.by_device:
            line += " (" + ", ".join(f"{device} {n}" for device, n in self.by_device) + ")"
        return line


class Backend(abc.ABC):  # noqa: B024 - its kinds (LLMBackend, ClassifierBackend) declare the abstract methods
    """Anything that owns native handles: closed once, in reverse order of creation."""

    name = "abstract"

    def close(self) -> None:  # noqa: B027 - optional for backends with nothing to free
        pass

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class SpecialToken:
    """A token that the tokenizer matches as a whole in text before anything else."""

    id: int
    text: str
    control: bool  # matched only with ``special=True``; otherwise user-defined, matched even in plain text
    lstrip: bool = False  # whitespace before it is absorbed
    rstrip: bool = False  # whitespace after it is absorbed


class LLMBackend(Backend):
    n_ctx: int  # KV cells available
    gpu_offload: bool = False  # whether layers can live on a GPU in this build
    # decode(..., logits_all=True) keeps the logits of every token and sample(sampler, index) samples from any of
    # them: what speculative decoding verifies a draft with (runtime/llm/speculative.py)
    can_speculate: bool = False

    def special_tokens(self) -> Sequence[SpecialToken]:
        """Every token :meth:`tokenize` matches as a whole when ``special`` is set, longest text first.

        A tokenizer without such tokens returns none (the default). Chat templates use
        this to keep message content from turning into control tokens (runtime/llm/chat_tokens.py).
        """
        return ()

    @abc.abstractmethod
    def tokenize(self, text: str, *, add_bos: bool, special: bool) -> list[int]: ...

    @abc.abstractmethod
    def token_bytes(self, token: int) -> bytes: ...

    @abc.abstractmethod
    def special_text(self, which: str) -> str:
        """The text of the "bos" or "eos" token ('' if the model has none)."""

    @abc.abstractmethod
    def is_eog(self, token: int) -> bool: ...

    @abc.abstractmethod
    def decode(self, tokens: Sequence[int], start: int, *, logits_all: bool = False) -> None:
        """Evaluate ``tokens`` at positions ``start..``; keeps the last token's logits, or with ``logits_all``
        (only where :attr:`can_speculate`; at most one batch of tokens) every token's, for ``sample(sampler, i)``."""

    @abc.abstractmethod
    def remove(self, start: int, end: int = -1) -> bool:
        """Drop cells with positions in [start, end) (end -1: to the end). False if unsupported."""

    @abc.abstractmethod
    def shift(self, start: int, end: int, delta: int) -> None:
        """Add ``delta`` to the positions in [start, end) (context shift)."""

    @abc.abstractmethod
    def can_shift(self) -> bool: ...

    @abc.abstractmethod
    def new_sampler(self, params: SamplingParams) -> Any:
        """A sequence's sampler for ``params``, its grammar (``params.grammar``) included."""

    def check_grammar(self, grammar: Any) -> None:
        """BadInput unless ``grammar`` (runtime.llm.grammar.Grammar) compiles for this model: a request's grammar is
        refused before it is admitted. A backend that cannot constrain decoding refuses every grammar."""
        raise BadInput(f"the {self.name} backend cannot constrain decoding to {grammar.what}")

    @abc.abstractmethod
    def sample(self, sampler: Any, index: int = -1) -> int:
        """Sample from the last decoded token's logits, or (``logits_all``) from those of token ``index`` of the
        last decode, and record the token for penalties."""

    @abc.abstractmethod
    def state_size(self) -> int:
        """Bytes that :meth:`save_state` would return now."""

    @abc.abstractmethod
    def save_state(self) -> Any:
        """The KV state of the sequence (a bytes-like object), to restore with :meth:`load_state`."""

    @abc.abstractmethod
    def load_state(self, data: Any) -> bool: ...

    @abc.abstractmethod
    def clear(self) -> None: ...


# The most elements one tensor of a classifier model may declare, a dynamic dimension counted as 1: 2^26 (256 MiB of
# float32). What edgerun serves is far below (a 224 px RGB input is 150,528, ImageNet's logits 1,000, openWakeWord's
# mel input of one chunk 80,000 samples); a file that declares more is refused at load, before numpy (a fixed batch
# is padded to its size) or the runtime allocate by it (a batch of 2^40-1 asked numpy for 768 TiB).
MAX_TENSOR_ELEMENTS = 1 << 26
DYNAMIC = -1  # a dimension the model leaves open (ONNX symbolic or unset, TFLite shape_signature -1)


def bounded_shape(where: str, name: str, dims: Sequence[int], limit: int = MAX_TENSOR_ELEMENTS, *,
                  empty_ok: bool = False) -> tuple[int, ...]:
    """``dims`` of the tensor ``name`` in the model at ``where`` as a shape, each a positive size or DYNAMIC,
    refused in one line (BadInput) when a dimension is negative, zero (unless ``empty_ok``: a model's inner tensors
    may be empty, its input and output may not) or the tensor holds more than ``limit`` elements with its dynamic
    dimensions at 1. Exact integer arithmetic: no product overflows."""
    shape = tuple(int(d) for d in dims)
    bad = next((d for d in shape if d != DYNAMIC and d < (0 if empty_ok else 1)), None)
    if bad is not None:
        raise BadInput(f"{where}: tensor {name!r} has shape {list(shape)}: dimension {bad} is not valid "
                       f"(a positive size, or dynamic)")
    elements = 1
    for d in shape:
        elements *= max(d, 1)
    if elements > limit:
        raise BadInput(f"{where}: tensor {name!r} has shape {list(shape)}, {elements} elements: more than the "
                       f"{limit} ({limit * 4 >> 20} MiB of float32) one tensor of a classifier may hold")
    return shape


@dataclass(frozen=True)
class TensorInfo:
    """One model input or output as the native runtime reports it."""

    name: str
    shape: tuple[int, ...]  # -1 where the dimension is dynamic
    dtype: str  # numpy dtype name: float32, int8, uint8
    scale: float = 0.0  # integer tensors: real = scale * (q - zero_point)
    zero_point: int = 0


class ClassifierBackend(Backend):
    """A one-input, one-output tensor model (LiteRT, ONNX Runtime, null).

    :meth:`run` checks the batch against :attr:`input`, splits it into the batch
    size the model takes, and turns any failure of the native call into one
    :class:`BackendError` line. A backend implements ``_run`` for one call the
    model accepts and ``_resize`` when it can change the batch size.
    """

    input: TensorInfo
    output: TensorInfo

    def run(self, batch: Any) -> Any:
        import numpy as np

        want = self.input
        if not isinstance(batch, np.ndarray) or batch.ndim != len(want.shape):
            got = getattr(batch, "shape", type(batch).__name__)
            raise BadInput(f"{self.name}: input must be an array of shape {want.shape}, got {got}")
        if batch.dtype != np.dtype(want.dtype):
            raise BadInput(f"{self.name}: input dtype is {batch.dtype}, the model takes {want.dtype}")
        for axis, (n, m) in enumerate(zip(batch.shape[1:], want.shape[1:], strict=True), 1):
            if m != -1 and n != m:
                raise BadInput(f"{self.name}: input dimension {axis} is {n}, the model takes {m} (shape {want.shape})")
        if len(batch) == 0:
            raise BadInput(f"{self.name}: empty batch")
        batch = np.ascontiguousarray(batch)
        rows = self._guarded(self._resize, len(batch))
        if rows == len(batch):
            return self._checked(batch, rows)
        # The model takes a fixed number of rows: feed that many at a time, the last call padded with copies
        # of the last row (classifier rows are independent), and keep only the real rows' outputs.
        out = []
        for start in range(0, len(batch), rows):
            chunk = batch[start : start + rows]
            real = len(chunk)
            if real < rows:
                chunk = np.concatenate([chunk, np.repeat(chunk[-1:], rows - real, axis=0)])
            out.append(self._checked(chunk, rows)[:real])
        return np.concatenate(out)

    def _checked(self, batch: Any, rows: int) -> Any:
        y = self._guarded(self._run, batch)
        if getattr(y, "ndim", 0) < 1 or len(y) != rows:
            raise BackendError(f"{self.name}: the model returned {getattr(y, 'shape', type(y).__name__)} for {rows} input rows")
        return y

    def _guarded(self, call: Any, arg: Any) -> Any:
        """``call(arg)`` with any native failure turned into one BackendError line."""
        try:
            return call(arg)
        except EdgerunError:
            raise
        except Exception as exc:  # native runtimes raise their own types (RuntimeError, ORT's Fail, MemoryError)
            raise BackendError(f"{self.name}: the model failed at run time ({type(exc).__name__}: {one_line(exc)})") from None

    @abc.abstractmethod
    def _run(self, batch: Any) -> Any:
        """One native call on a batch whose size the model currently accepts."""

    def _resize(self, n: int) -> int:
        """Make the next ``_run`` take ``n`` rows if the model can; the rows it will take (n, or its fixed batch)."""
        fixed = self.input.shape[0]
        return n if fixed in (-1, n) else fixed

    @abc.abstractmethod
    def offload(self) -> Offload:
        """:class:`Offload` (ops or nodes on the accelerator) after load."""


