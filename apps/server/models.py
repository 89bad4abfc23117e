"""The served models by public name: what kind each is, and a lease on the loaded model while a request uses it.

Loading, eviction and the one memory plan are runtime.residency.manager.ResidencyManager's; this module only turns the
serve config's [[models]] into its ModelSpecs (finding each model's kind from its bundle) and leases from it.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from apps.server.config import ModelEntry, ServeConfig
from apps.server.openai_api import NotReady
from runtime.errors import BadInput
from runtime.residency.manager import ModelSpec, ResidencyManager
from runtime.residency.spec import ResidentKind

log = logging.getLogger(__name__)
OPTIONS = {ResidentKind.LLM: ("slots", "ctx", "threads"), ResidentKind.VISION: ("batch", "threads"),
           ResidentKind.AUDIO: ("threads",)}  # serve.toml's
LEASE_WAIT_S = 30.0  # how long a request waits for leased models in its way to be released before DoesNotFit


class Unavailable(NotReady):
    """A configured model that cannot be served (HTTP 503)."""


def kind_of(entry: ModelEntry) -> ResidentKind:
    """The entry's kind (one of apps.server.config.SERVED_KINDS): as configured, else read from its bundle (resolving it builds a
    recipe on first use and installs a .edgerun file)."""
    if entry.kind:
        return entry.kind
    from runtime.bundle.resolve import resolve

    return ResidentKind(resolve(entry.ref).manifest.kind.value)


def capabilities_of(entry: ModelEntry, kind: ResidentKind) -> dict[str, Any]:
    """What a model can do, as GET /v1/models reports it: ``capabilities`` (completion; chat, tools and
    logprobs...; classify for the classifiers) and, for a language model, its chat template: present or not, and
    whether it renders tools itself (``tools_in_template``; otherwise tools use edgerun's format, runtime/llm/tools.py)."""
    if kind != ResidentKind.LLM:
        return {"capabilities": ["classify"]}
    from runtime.bundle.resolve import resolve
    from runtime.llm.chat_template import renders_tools

    spec = resolve(entry.ref).manifest.llm
    template = spec.chat_template if spec is not None else None
    abilities = ["completion", "json_schema", "grammar", "logprobs"]
    if template:
        abilities[1:1] = ["chat", "tools"]
    return {"capabilities": abilities,
            "chat_template": {"present": bool(template), "tools_in_template": bool(template) and renders_tools(template)}}


def spec_of(entry: ModelEntry, kind: ResidentKind, slots: int, max_queued: int, speculate: bool = True,
            decode_bytes: int = 0) -> ModelSpec:
    """``decode_bytes``: what the server's classify decode slots hold at most, planned with its vision models."""
    bad = sorted(set(entry.options) - set(OPTIONS[kind]))
    if bad:
        raise BadInput(f"model {entry.name!r} ({kind}): option {bad[0]!r} does not apply (valid: {', '.join(OPTIONS[kind])})")
    options = dict(entry.options)
    if kind == ResidentKind.LLM:
        options.setdefault("slots", slots)
        options["max_queued"] = max_queued
        options["speculate"] = speculate
    if kind == ResidentKind.VISION and decode_bytes:
        options["decode_bytes"] = decode_bytes
    keep = None if entry.keep_alive < 0 else entry.keep_alive
    return ModelSpec(entry.name, entry.ref, kind, pinned=entry.pinned, keep_alive_s=keep, options=options)


class Models:
    def __init__(self, config: ServeConfig, manager: ResidencyManager | None = None) -> None:
        from runtime.llm.plan import default_budget

        self.config = config
        self.manager = manager if manager is not None else ResidencyManager(config.memory or default_budget())
        self.kinds: dict[str, ResidentKind] = {}
        self.unavailable: dict[str, str] = {}  # name -> why it could not be planned (a rolled-back canary)
        self.abilities: dict[str, dict[str, Any]] = {}  # name -> what /v1/models says it can do (capabilities_of)

    def add(self, entry: ModelEntry) -> None:
        from runtime.classify.preprocess import decode_bytes

        kind, limits = kind_of(entry), self.config.limits
        decode = limits.decode_slots * decode_bytes(limits.max_image_pixels)
        self.manager.add(spec_of(entry, kind, self.config.slots, limits.max_queued, self.config.speculate, decode))
        self.kinds[entry.name] = kind
        self.abilities[entry.name] = capabilities_of(entry, kind)

    def load_pinned(self) -> None:
        """Load the pinned models and the default one now, so the first request does not wait for them."""
        for entry in self.config.models:
            if (entry.pinned or entry.name == self.config.default_model) and entry.name not in self.unavailable:
                with self.acquire(entry.name):
                    pass

    def acquire(self, name: str) -> contextlib.AbstractContextManager[Any]:
        if name in self.unavailable:
            raise Unavailable(f"model {name!r} could not be planned: {self.unavailable[name]}")
        return self.manager.acquire(name, wait_s=LEASE_WAIT_S)

    def resident(self) -> list[dict[str, Any]]:
        return self.manager.resident()

    def sweep(self) -> list[str]:
        return self.manager.sweep()

    def close(self) -> None:
        self.manager.close()

