"""Which models are loaded, under one memory plan: load on demand, evict the least recently used.

One :class:`ResidencyManager` per process holds every resident model (LLMs, vision and audio
classifiers) within one budget. The server, the kiosk and the voice assistant share it::

    from runtime.residency.manager import ModelSpec, ResidencyManager
    from runtime.units import parse_size

    models = ResidencyManager(parse_size("1.5G"))
    models.add(ModelSpec("chat", "default", "llm", pinned=True, options={"ctx": 2048, "slots": 4}))
    models.add(ModelSpec("digits", "/models/digits", "vision", keep_alive_s=60))
    with models.acquire("chat") as engine:  # a runtime.serving.engine.Engine, loaded on first use; a lease: never
                                           # evicted while held
        ...                                # hold the lease for the whole request, streaming included
    models.sweep()                         # now and then: unload models idle longer than their keep_alive_s
    models.swap("chat", ModelSpec("chat", "default@2", "llm"))  # new leases get version 2; a lease
                                           # held across the swap keeps version 1, which closes when released
    models.close()

``acquire`` plans before it loads: when the summed plans would pass the budget it unloads the least
recently used models that are neither pinned nor leased, and raises DoesNotFit (one line naming what is
resident and what is needed) when even that cannot make room; nothing is loaded then. A pinned model
is never evicted and never expires; the pinned models together must fit (checked by ``add``).
``keep_alive_s`` is Ollama's ``keep_alive``: None keeps a model until it is evicted, 0 unloads it as
soon as its last lease ends. Loads run outside the lock: other models keep serving meanwhile, and a
second caller of a model that is loading waits for that load instead of starting its own.

How the plans are summed, and why that is honest
-------------------------------------------------
Each model is planned alone against the whole budget by its own planner (:func:`runtime.llm.plan.plan_llm`,
:func:`runtime.classify.plan.plan_classifier`), so its figure does not depend on what else happens to be
resident. A plan's total is its own memory (weights, KV cache, compute, prefix cache, vocabulary,
arena, inputs) plus the ``runtime`` term: the libraries the process has loaded to run it (for an LLM:
the interpreter, numpy, libllama, jinja2; for a classifier: LiteRT's or ONNX Runtime's library, over a
numpy process). A library is mapped into a process once, however many models use it, so the manager
sums the models' own memory, adds each library's runtime term once (the largest any resident model
plans for it: keys ``llamacpp``, ``litert``, ``ort``) and the budget's 5 % reserve once:
``sum(own) + sum(max runtime per library) + reserve <= budget``. Counting the runtime per model
would refuse a second model that fits. The LLM's runtime term also holds llama.cpp's fixed per-context
allocations, which a second context repeats. Measured on x86_64 by bench/residency_memory.py (SmolLM2
Q4_1 twice, then Gemma 3 270M, 512 tokens per slot, f16 KV, 8 MiB prefix cache, one process): as
runtime.llm.model.LLM the second SmolLM2 added 117-124 MiB of RSS against its own plan's 133 MiB, Gemma 307-313
against 307, and the whole process (interpreter and numpy included) ended at 613 MiB against the sum's
653; as the 4-slot runtime.serving.engine.Engine 151 against 167, 335 against 337, 710 against 752. The one
runtime term covers the repeats.
A model is loaded with ``memory=`` its own plan's total plus
that share's reserve, so its planner makes the same plan again (the default loaders check that it did,
and refuse the load if not).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from runtime.bundle.store import check_ref
from runtime.errors import BadInput, DoesNotFit, EdgerunError, one_line
from runtime.llm.plan import RESERVE_FRACTION
from runtime.residency.spec import DEFAULT_KEEP_ALIVE_S, Loader, ModelSpec, ResidentKind
from runtime.units import fmt_bytes

log = logging.getLogger(__name__)

# ModelSpec, its kinds and the Loader contract live in runtime.residency.spec, so that the loaders take them from there
# and never import the manager (which imports the loaders); they are the manager's API all the same.
__all__ = ["DEFAULT_KEEP_ALIVE_S", "Loader", "ModelSpec", "ResidencyManager", "ResidentKind", "share_for", "summed_bytes"]


def share_for(planned: int) -> int:
    """The budget whose 5 % reserve plus ``planned`` bytes fills it: what a model is loaded with."""
    share = math.ceil(planned / (1 - RESERVE_FRACTION))
    while share - int(share * RESERVE_FRACTION) < planned:  # float rounding
        share += 1
    return share


@dataclass(eq=False)
class _Entry:
    spec: ModelSpec
    planned: int  # the model's own plan total, its runtime included
    shared: Mapping[str, int]  # library -> the runtime bytes of the plan that library accounts for
    obj: Any = None
    state: str = "planned"  # planned (not loaded) | loading | ready | retired (swapped or removed, closes at release)
    leases: int = 0
    last_used: float = 0.0
    loaded_at: float = 0.0
    error: BaseException | None = None

    def copy(self) -> _Entry:
        return _Entry(self.spec, self.planned, self.shared)

    def evictable(self) -> bool:
        return self.state == "ready" and self.leases == 0 and not self.spec.pinned


def summed_bytes(entries: Iterable[_Entry]) -> int:
    """Every model's own bytes plus each library's runtime once (see the module docstring)."""
    own, libraries = 0, dict[str, int]()
    for e in entries:
        own += e.planned - sum(e.shared.values())
        for lib, size in e.shared.items():
            libraries[lib] = max(libraries.get(lib, 0), size)
    return own + sum(libraries.values())


def _describe(e: _Entry) -> str:
    leases = f"{e.leases} lease{'s' * (e.leases != 1)}"
    why = [w for w, on in (("pinned", e.spec.pinned), (leases, e.leases), (e.state, e.state != "ready")) if on]
    return f"{e.spec.name} {fmt_bytes(e.planned)}" + (f" ({', '.join(why)})" if why else "")


def _version(obj: Any) -> str:
    manifest = getattr(getattr(obj, "model", None), "manifest", None)
    return str(getattr(manifest, "version", None) or getattr(obj, "version", "") or "")


class ResidencyManager:
    """Resident models under one memory plan of ``budget_bytes``; thread-safe. ``loaders``: kind -> Loader
    (default :func:`runtime.residency.loaders.default_loaders`); ``clock``: monotonic seconds (keep-alive, LRU)."""

    def __init__(self, budget_bytes: int, *, loaders: Mapping[str, Loader] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not isinstance(budget_bytes, int) or budget_bytes <= 0:
            raise BadInput(f"residency budget {budget_bytes!r} must be a positive number of bytes")
        if loaders is None:
            from runtime.residency.loaders import default_loaders

            loaders = default_loaders()
        self.budget_bytes = budget_bytes
        self.reserve_bytes = int(budget_bytes * RESERVE_FRACTION)
        self._loaders = dict(loaders)
        self._clock = clock
        self._cond = threading.Condition()
        self._specs: dict[str, _Entry] = {}  # name -> the current spec, planned (state "planned")
        self._current: dict[str, _Entry] = {}  # name -> its loading or loaded entry
        self._live: list[_Entry] = []  # every entry holding memory: loading, ready, retired
        self._closed = False
        self._counts = {"loads": 0, "evictions": 0, "expired": 0, "swaps": 0, "load_failures": 0}

    # -- the catalogue ------------------------------------------------------------------------
    def add(self, spec: ModelSpec) -> None:
        """Register ``spec`` and plan it (nothing is loaded). BadInput for a bad spec or a name already added;
        DoesNotFit when it does not fit the budget alone, or a pinned one does not fit beside the other pinned."""
        planned = self._plan(spec)
        with self._cond:
            self._check_open()
            if spec.name in self._specs:
                raise BadInput(f"model name {spec.name!r} is already added (swap() replaces it, remove() drops it)")
            self._check_pinned(planned, exclude=None)
            self._specs[spec.name] = planned

    def remove(self, name: str) -> None:
        """Forget ``name``; its loaded model closes now, or when its last lease ends."""
        with self._cond:
            self._spec(name)
            del self._specs[name]
            self._retire(name)

    def swap(self, name: str, new_spec: ModelSpec) -> None:
        """Replace ``name``'s spec (a new version): leases taken from now on get the new model (loaded on
        demand); a lease held across the swap keeps the old one, which closes when its last lease ends."""
        if new_spec.name != name:
            raise BadInput(f"swap({name!r}) got a spec named {new_spec.name!r}; a swap keeps the model's name")
        planned = self._plan(new_spec)
        with self._cond:
            self._spec(name)
            self._check_pinned(planned, exclude=name)
            self._specs[name] = planned
            self._retire(name)
            self._counts["swaps"] += 1
        log.info("%s: swapped to %s", name, new_spec.ref)

    def specs(self) -> list[ModelSpec]:
        with self._cond:
            return [e.spec for e in self._specs.values()]

    def planned_bytes(self, name: str) -> int:
        """``name``'s plan total (its runtime included), whether loaded or not."""
        with self._cond:
            return self._spec(name).planned

    # -- leases -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def acquire(self, name: str, *, wait_s: float = 0.0) -> Iterator[Any]:
        """The loaded model ``name``, loaded on demand, leased for the ``with`` block (never evicted meanwhile).
        DoesNotFit when it cannot fit even after evicting every idle unpinned model; ``wait_s``: how long to
        wait first for leased or loading models that stand in the way to be released."""
        entry = self._lease(name, wait_s)
        try:
            yield entry.obj
        finally:
            self._release(entry)

    def _lease(self, name: str, wait_s: float) -> _Entry:
        deadline = time.monotonic() + max(0.0, wait_s)
        with self._cond:
            while True:
                self._check_open()
                planned = self._spec(name)
                entry = self._current.get(name)
                if entry is not None and entry.state == "ready":
                    entry.leases += 1
                    entry.last_used = self._clock()
                    return entry
                if entry is not None:  # loading in another thread: take that one, or its error
                    while entry.state == "loading":
                        self._cond.wait()
                    if entry.error is not None:
                        raise entry.error
                    continue
                victims = self._room_for(planned)
                if victims is None:
                    left = deadline - time.monotonic()
                    if left > 0 and any(e.leases or e.state == "loading" for e in self._live):
                        self._cond.wait(left)
                        continue
                    raise self._does_not_fit(planned)
                for victim in victims:
                    log.info("%s: evicted (least recently used) to make room for %s", victim.spec.name, name)
                    self._counts["evictions"] += 1
                    self._unload(victim)
                entry = planned.copy()
                entry.state, entry.leases = "loading", 1
                self._current[name] = entry
                self._live.append(entry)
                break
        self._load(entry)
        return entry

    def _load(self, entry: _Entry) -> None:
        spec = entry.spec
        try:
            obj = self._loaders[spec.kind].load(spec, share_for(entry.planned))
        except BaseException as exc:
            with self._cond:
                entry.error, entry.state = exc, "failed"
                self._forget(entry)
                self._counts["load_failures"] += 1
                self._cond.notify_all()
            raise
        with self._cond:
            entry.obj = obj
            entry.loaded_at = entry.last_used = self._clock()
            if entry.state == "loading":  # not retired by a swap or remove meanwhile
                entry.state = "ready"
            self._counts["loads"] += 1
            self._cond.notify_all()
        log.info("%s: loaded %s (%s planned)", spec.name, spec.ref, fmt_bytes(entry.planned))

    def _release(self, entry: _Entry) -> None:
        with self._cond:
            entry.leases -= 1
            entry.last_used = self._clock()
            if entry.leases == 0 and (entry.state == "retired" or (entry.spec.keep_alive_s == 0 and not entry.spec.pinned)):
                self._unload(entry)
            self._cond.notify_all()

    # -- residency ----------------------------------------------------------------------------
    def sweep(self, now: float | None = None) -> list[str]:
        """Unload the idle, unpinned models whose keep_alive_s has passed since their last use; their names."""
        with self._cond:
            now = self._clock() if now is None else now
            expired = [e for e in self._current.values()
                       if e.evictable() and e.spec.keep_alive_s is not None and now - e.last_used >= e.spec.keep_alive_s]
            for e in expired:
                log.info("%s: unloaded after %.0f s idle (keep_alive %s s)", e.spec.name, now - e.last_used, e.spec.keep_alive_s)
                self._counts["expired"] += 1
                self._unload(e)
            self._cond.notify_all()
            return [e.spec.name for e in expired]

    def resident(self) -> list[dict[str, Any]]:
        """Every model holding memory now (loading, ready, or retired and still leased), most recently used first."""
        with self._cond:
            rows = [{"name": e.spec.name, "ref": e.spec.ref, "version": _version(e.obj), "kind": e.spec.kind,
                     "planned_bytes": e.planned, "pinned": e.spec.pinned, "leases": e.leases, "state": e.state,
                     "last_used": e.last_used, "loaded_at": e.loaded_at} for e in self._live]
        return sorted(rows, key=lambda r: -r["last_used"])

    def used_bytes(self) -> int:
        """The summed plans of the resident models (each library's runtime once), the reserve not included."""
        with self._cond:
            return summed_bytes(self._live)

    def stats(self) -> dict[str, int]:
        """Counters (loads, evictions, expired, swaps, load_failures) and bytes (used, reserve, budget)."""
        with self._cond:
            return {**self._counts, "resident": len(self._live), "used_bytes": summed_bytes(self._live),
                    "reserve_bytes": self.reserve_bytes, "budget_bytes": self.budget_bytes}

    def close(self) -> None:
        """Unload every model; a leased one closes when its lease ends. Later acquires are refused."""
        with self._cond:
            self._closed = True
            for name in list(self._current):
                self._retire(name)
            self._cond.notify_all()

    def __enter__(self) -> ResidencyManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals (called with the lock held, except _plan) ------------------------------------
    def _plan(self, spec: ModelSpec) -> _Entry:
        self._check_spec(spec)
        spec = dataclasses.replace(spec, options=MappingProxyType(dict(spec.options)))  # the caller's dict may change later
        loader = self._loaders[spec.kind]
        planned = int(loader.plan_bytes(spec, self.budget_bytes))
        shared_of = getattr(loader, "shared_bytes", None)
        shared = dict(shared_of(spec)) if shared_of is not None else {}
        if planned <= 0 or any(v < 0 for v in shared.values()) or sum(shared.values()) > planned:
            raise BadInput(f"{spec.name}: loader planned {planned} bytes with runtime parts {shared}; not a plan")
        entry = _Entry(spec, planned, shared)
        if summed_bytes([entry]) + self.reserve_bytes > self.budget_bytes:
            raise DoesNotFit(f"{spec.name} needs {fmt_bytes(planned)} but the budget is {fmt_bytes(self.budget_bytes)}"
                             f" less a {RESERVE_FRACTION:.0%} reserve")
        return entry

    def _check_spec(self, spec: ModelSpec) -> None:
        if not isinstance(spec, ModelSpec):
            raise BadInput(f"expected a ModelSpec, got {type(spec).__name__}")
        check_ref(spec.name)
        if spec.kind not in self._loaders:
            raise BadInput(f"{spec.name}: kind {spec.kind!r} is not one of: {', '.join(sorted(self._loaders))}")
        if not isinstance(spec.ref, str) or not spec.ref:
            raise BadInput(f"{spec.name}: ref {spec.ref!r} must name a model (an installed name, a bundle or a .gguf)")
        ka = spec.keep_alive_s
        if ka is not None and (isinstance(ka, bool) or not isinstance(ka, int | float) or not math.isfinite(ka) or ka < 0):
            raise BadInput(f"{spec.name}: keep_alive_s {ka!r} must be None (forever) or seconds >= 0")
        if not isinstance(spec.options, Mapping):
            raise BadInput(f"{spec.name}: options must be a mapping, not {type(spec.options).__name__}")

    def _check_open(self) -> None:
        if self._closed:
            raise EdgerunError("the residency manager is closed")

    def _spec(self, name: str) -> _Entry:
        entry = self._specs.get(name)
        if entry is None:
            raise BadInput(f"unknown model {name!r} (known: {', '.join(sorted(self._specs)) or 'none'})")
        return entry

    def _check_pinned(self, planned: _Entry, exclude: str | None) -> None:
        if not planned.spec.pinned:
            return
        pinned = [e for n, e in self._specs.items() if e.spec.pinned and n != exclude] + [planned]
        if summed_bytes(pinned) + self.reserve_bytes > self.budget_bytes:
            names = ", ".join(_describe(e) for e in pinned)
            raise DoesNotFit(f"the pinned models ({names}) need {fmt_bytes(summed_bytes(pinned))} together; the budget is "
                             f"{fmt_bytes(self.budget_bytes)} less a {fmt_bytes(self.reserve_bytes)} reserve")

    def _fits(self, entries: Iterable[_Entry]) -> bool:
        return summed_bytes(entries) + self.reserve_bytes <= self.budget_bytes

    def _room_for(self, planned: _Entry) -> list[_Entry] | None:
        """The least recently used evictable models to unload so that ``planned`` fits; None if none would do."""
        remaining = list(self._live)
        victims: list[_Entry] = []
        candidates = sorted((e for e in self._live if e.evictable()), key=lambda e: e.last_used)
        while not self._fits([*remaining, planned]):
            if not candidates:
                return None
            victims.append(candidates.pop(0))
            remaining.remove(victims[-1])
        return victims

    def _does_not_fit(self, planned: _Entry) -> DoesNotFit:
        held = ", ".join(_describe(e) for e in self._live) or "none"
        return DoesNotFit(f"{planned.spec.name} needs {fmt_bytes(planned.planned)} but {fmt_bytes(summed_bytes(self._live))}"
                          f" of the {fmt_bytes(self.budget_bytes)} budget (less a {fmt_bytes(self.reserve_bytes)} reserve)"
                          f" is held by models that cannot be evicted now; resident: {held}")

    def _retire(self, name: str) -> None:
        """``name``'s loaded entry leaves the catalogue: closed now if idle, else when its last lease ends."""
        entry = self._current.pop(name, None)
        if entry is None:
            return
        if entry.leases == 0 and entry.state == "ready":
            self._unload(entry)
        else:
            entry.state = "retired"

    def _forget(self, entry: _Entry) -> None:
        if self._current.get(entry.spec.name) is entry:
            del self._current[entry.spec.name]
        if entry in self._live:
            self._live.remove(entry)

    def _unload(self, entry: _Entry) -> None:
        self._forget(entry)
        entry.state = "closed"
        obj, entry.obj = entry.obj, None
        if obj is not None:
            try:
                obj.close()
            except Exception as exc:  # a failing close must not take the manager down; it is reported
                log.warning("%s: close failed: %s", entry.spec.name, one_line(exc))
