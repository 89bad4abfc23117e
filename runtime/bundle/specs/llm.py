"""The manifest's ``llm`` section: what the runtime needs to run a GGUF language model offline."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from runtime.bundle.fields import FILE_RE, required_field, text_field
from runtime.errors import BadInput
from runtime.llm.sampling import INT32_MAX, SamplingParams


@dataclass(frozen=True)
class LLMSpec:
    """What the runtime needs to run a GGUF language model offline."""

    architecture: str
    context_length: int  # tokens the model was trained for
    chat_template: str | None = None
    quantization: str = ""
    sampling: dict[str, Any] = field(default_factory=dict)  # default sampling settings, as SamplingParams names them
    draft: str | None = None  # a bundle file: the draft model's GGUF for speculative decoding (runtime/llm/draft.py)

    def __post_init__(self) -> None:
        # Typed and bounded here, whoever builds the spec: a bad default never reaches llama.cpp.
        SamplingParams.check_defaults(self.sampling, "manifest llm.sampling")

    @classmethod
    def from_dict(cls, data: Any) -> LLMSpec:
        where = "manifest llm"
        if not isinstance(data, dict):
            raise BadInput("manifest: field 'llm' must be an object")
        ctx = required_field(data, "context_length", int, where)
        if not 0 < ctx <= INT32_MAX:  # llama.cpp's context fields are 32-bit
            raise BadInput(f"{where}: context_length {ctx!r:.80} must be in [1, {INT32_MAX}] tokens")
        template = data.get("chat_template")
        if template is not None and not isinstance(template, str):
            raise BadInput(f"{where}: chat_template must be a string or null")
        draft = data.get("draft")
        if draft is not None and not (isinstance(draft, str) and FILE_RE.fullmatch(draft)):
            raise BadInput(f"{where}: draft {draft!r:.80} must be the name of a bundle file (its draft model's GGUF) or null")
        return cls(
            architecture=required_field(data, "architecture", str, where),
            context_length=ctx,
            chat_template=template,
            quantization=text_field(data, "quantization", "", where),
            sampling=data.get("sampling", {}),
            draft=draft,
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.draft is None:  # a bundle without a draft model reads as it always has
            del data["draft"]
        return data
