"""The residency manager: one memory plan for every resident model, LRU eviction, pins, leases, keep-alive, swaps.

Most tests use a fake loader (plans are the sizes the spec's options say, loads are instant objects) so that the
ordering rules are tested exactly; the slow test at the end runs the real loaders on two real GGUF models and a
tiny vision bundle.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from devices.backends import BackendName
from runtime.errors import BadInput, DoesNotFit, EdgerunError
from runtime.residency.manager import ModelSpec, ResidencyManager, share_for, summed_bytes

MiB = 1 << 20
BUDGET = 100 * MiB  # reserve 5 MiB: 95 MiB for models


class FakeModel:
    def __init__(self, spec: ModelSpec, budget: int) -> None:
        self.name, self.version, self.budget, self.closed = spec.name, spec.ref, budget, False

    def close(self) -> None:
        assert not self.closed, "closed twice"
        self.closed = True


class FakeLoader:
    """Plans ``options["mib"]`` MiB, of which ``options["lib_mib"]`` belong to library ``options["lib"]``."""

    def __init__(self) -> None:
        self.loaded: list[FakeModel] = []
        self.gate: threading.Event | None = None  # set: loads wait on it
        self.fail: Exception | None = None

    def plan_bytes(self, spec: ModelSpec, budget: int) -> int:
        return int(spec.options["mib"] * MiB)

    def shared_bytes(self, spec: ModelSpec) -> dict[str, int]:
        return {spec.options["lib"]: spec.options["lib_mib"] * MiB} if "lib" in spec.options else {}

    def load(self, spec: ModelSpec, budget: int) -> FakeModel:
        if self.gate is not None:
            assert self.gate.wait(10)
        if self.fail is not None:
            raise self.fail
        model = FakeModel(spec, budget)
        self.loaded.append(model)
        return model


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def loader() -> FakeLoader:
    return FakeLoader()


@pytest.fixture
def clock() -> Clock:
    return Clock()


def manager(loader: FakeLoader, clock: Clock, *specs: ModelSpec, budget: int = BUDGET) -> ResidencyManager:
    rm = ResidencyManager(budget, loaders={"llm": loader, "vision": loader, "audio": loader}, clock=clock)
    for spec in specs:
        rm.add(spec)
    return rm


def spec(name: str, mib: float, kind: str = "llm", **kw: Any) -> ModelSpec:
    options = {"mib": mib, **kw.pop("options", {})}
    return ModelSpec(name, kw.pop("ref", f"{name}-v1"), kind, options=options, **kw)


def names(rm: ResidencyManager) -> set[str]:
    return {r["name"] for r in rm.resident()}


def use(rm: ResidencyManager, name: str, clock: Clock) -> Any:
    """Acquire and release ``name`` at the next tick; check the budget holds. The model used."""
    clock.now += 1
    with rm.acquire(name) as model:
        within_plan(rm)
    within_plan(rm)
    return model


def within_plan(rm: ResidencyManager) -> None:
    assert rm.used_bytes() + rm.reserve_bytes <= rm.budget_bytes, rm.resident()


def test_least_recently_used_idle_model_is_evicted_first(loader, clock) -> None:
    # Two LLMs and a classifier; any two fit (95 MiB), all three (110 MiB) do not.
    rm = manager(loader, clock, spec("a", 40), spec("b", 40), spec("clf", 30, "vision"))
    use(rm, "a", clock)
    use(rm, "b", clock)
    assert names(rm) == {"a", "b"}
    first_a = loader.loaded[0]
    use(rm, "clf", clock)  # a is the least recently used
    assert names(rm) == {"b", "clf"} and first_a.closed
    use(rm, "b", clock)  # now clf is older than b
    use(rm, "a", clock)
    assert names(rm) == {"a", "b"}
    assert rm.stats()["evictions"] == 2 and rm.stats()["loads"] == 4


def test_evicts_only_as_many_as_needed_in_lru_order(loader, clock) -> None:
    rm = manager(loader, clock, spec("a", 20), spec("b", 20), spec("c", 20), spec("d", 20), spec("big", 50))
    for n in "abcd":
        use(rm, n, clock)
    use(rm, "b", clock)  # order, oldest first: a c d b
    use(rm, "big", clock)  # 80 + 50 > 95: a and c go (45 left + 50 = 95)
    assert names(rm) == {"d", "b", "big"}


def test_a_pinned_model_is_never_evicted(loader, clock) -> None:
    rm = manager(loader, clock, spec("a", 40, pinned=True), spec("b", 40), spec("clf", 30, "vision"))
    use(rm, "a", clock)  # a is the least recently used, but pinned
    use(rm, "b", clock)
    use(rm, "clf", clock)
    assert names(rm) == {"a", "clf"}
    use(rm, "b", clock)
    assert names(rm) == {"a", "b"}
    clock.now += 10_000
    assert rm.sweep() == ["b"]  # a pinned model does not expire either
    assert names(rm) == {"a"}


def test_a_leased_model_is_never_evicted_and_the_refusal_names_what_is_resident(loader, clock) -> None:
    rm = manager(loader, clock, spec("a", 40), spec("b", 40, pinned=True), spec("clf", 30, "vision"))
    use(rm, "b", clock)
    with rm.acquire("a") as a:
        with pytest.raises(DoesNotFit) as err:
            with rm.acquire("clf"):
                pass
        assert not a.closed
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("clf needs 30.0 MiB")
    assert "a 40.0 MiB (1 lease)" in message and "b 40.0 MiB (pinned)" in message
    assert names(rm) == {"a", "b"} and len(loader.loaded) == 2  # nothing was loaded or evicted
    use(rm, "clf", clock)  # released: a goes now
    assert names(rm) == {"b", "clf"}


def test_a_waiting_acquire_gets_the_room_a_released_lease_leaves(loader, clock) -> None:
    rm = manager(loader, clock, spec("a", 60), spec("b", 60))
    got: list[Any] = []
    with rm.acquire("a"):
        with pytest.raises(DoesNotFit):
            with rm.acquire("b"):
                pass

        def take() -> None:
            with rm.acquire("b", wait_s=10) as b:
                got.append(b)

        waiter = threading.Thread(target=take)
        waiter.start()
        time.sleep(0.05)
        assert not got
    waiter.join(10)
    assert got and got[0].name == "b" and names(rm) == {"b"}


def test_runtime_libraries_are_counted_once(loader, clock) -> None:
    # Each LLM plans 40 MiB of which 20 MiB is libllama: together 60 MiB, not 80.
    llm = {"lib": "llamacpp", "lib_mib": 20}
    rm = manager(loader, clock, spec("a", 40, options=llm), spec("b", 40, options=llm),
                 spec("clf", 30, "vision", options={"lib": "ort", "lib_mib": 25}), budget=int(95 * MiB / 0.95) + 1)
    use(rm, "a", clock)
    use(rm, "b", clock)
    assert rm.used_bytes() == 60 * MiB
    use(rm, "clf", clock)  # 60 + 30 = 90 <= 90.25: all three fit
    assert names(rm) == {"a", "b", "clf"} and rm.used_bytes() == 90 * MiB


def test_summed_bytes_takes_the_largest_runtime_per_library(loader, clock) -> None:
    rm = manager(loader, clock, spec("a", 40, options={"lib": "llamacpp", "lib_mib": 20}),
                 spec("b", 50, options={"lib": "llamacpp", "lib_mib": 30}))
    use(rm, "a", clock)
    use(rm, "b", clock)
    assert rm.used_bytes() == (40 - 20) * MiB + (50 - 30) * MiB + 30 * MiB
    assert summed_bytes([]) == 0


def test_each_model_is_loaded_with_the_share_it_was_planned_with(loader, clock) -> None:
    rm = manager(loader, clock, spec("a", 40))
    model = use(rm, "a", clock)
    assert model.budget == share_for(40 * MiB)
    assert model.budget - int(model.budget * 0.05) >= 40 * MiB  # its planner's 5 % reserve fits beside its plan
    assert model.budget <= 40 * MiB / 0.95 + 2  # and no more: the share is the plan plus that reserve


def test_keep_alive_expires_idle_models_on_sweep(loader, clock) -> None:
    rm = manager(loader, clock, spec("short", 10, keep_alive_s=10), spec("forever", 10, keep_alive_s=None),
                 spec("once", 10, keep_alive_s=0), spec("busy", 10, keep_alive_s=1))
    use(rm, "short", clock)  # released at t=1
    use(rm, "forever", clock)
    once = use(rm, "once", clock)
    assert once.closed and "once" not in names(rm)  # keep_alive 0: unloaded when its lease ends
    with rm.acquire("busy"):
        assert rm.sweep(now=10.9) == []
        assert rm.sweep(now=11) == ["short"]
        assert rm.sweep(now=1e9) == []  # busy is leased, forever never expires
    clock.now = 1e9
    assert rm.sweep() == ["busy"]
    assert names(rm) == {"forever"} and rm.stats()["expired"] == 2


def test_swap_keeps_the_old_version_for_a_lease_held_across_it(loader, clock) -> None:
    rm = manager(loader, clock, spec("chat", 40))
    with rm.acquire("chat") as old:
        rm.swap("chat", spec("chat", 40, ref="chat-v2"))
        within_plan(rm)
        with rm.acquire("chat") as new:  # both resident: 80 MiB
            assert (old.version, new.version) == ("chat-v1", "chat-v2")
            within_plan(rm)
            assert {(r["version"], r["state"]) for r in rm.resident()} == {("chat-v1", "retired"), ("chat-v2", "ready")}
        assert not old.closed
        assert old.version == "chat-v1"  # still serving the request in flight
    assert old.closed and not new.closed
    assert [r["version"] for r in rm.resident()] == ["chat-v2"]


def test_swap_of_an_idle_model_closes_it_at_once_and_a_new_version_that_cannot_fit_waits_for_the_old(loader, clock) -> None:
    rm = manager(loader, clock, spec("chat", 60))
    first = use(rm, "chat", clock)
    rm.swap("chat", spec("chat", 60, ref="chat-v2"))
    assert first.closed and not rm.resident()
    assert use(rm, "chat", clock).version == "chat-v2"
    with rm.acquire("chat") as v2:
        rm.swap("chat", spec("chat", 60, ref="chat-v3"))
        with pytest.raises(DoesNotFit, match="chat 60.0 MiB .1 lease, retired"):
            with rm.acquire("chat"):
                pass
    assert v2.closed and use(rm, "chat", clock).version == "chat-v3"


def test_concurrent_acquires_share_one_load(loader, clock) -> None:
    rm = manager(loader, clock, spec("a", 40))
    loader.gate = threading.Event()
    got: list[Any] = []

    def take() -> None:
        with rm.acquire("a") as model:
            got.append(model)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    assert [r["state"] for r in rm.resident()] == ["loading"]
    loader.gate.set()
    for t in threads:
        t.join(10)
    assert len(loader.loaded) == 1 and len(got) == 4 and all(m is got[0] for m in got)


def test_a_failed_load_reaches_every_waiter_and_frees_its_room(loader, clock) -> None:
    rm = manager(loader, clock, spec("a", 40))
    loader.gate, loader.fail = threading.Event(), BadInput("a: broken model file")
    errors: list[BaseException] = []

    def take() -> None:
        try:
            with rm.acquire("a"):
                pass
        except BadInput as exc:
            errors.append(exc)

    threads = [threading.Thread(target=take) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    loader.gate.set()
    for t in threads:
        t.join(10)
    assert len(errors) == 3 and not rm.resident() and rm.used_bytes() == 0
    loader.fail = None
    assert use(rm, "a", clock).name == "a"


@pytest.mark.parametrize(("bad", "error", "match"), [
    (ModelSpec("../etc", "x", "llm", options={"mib": 1}), BadInput, "name"),  # a public name is never a path
    (ModelSpec("ok", "x", "tts", options={"mib": 1}), BadInput, "kind 'tts' is not one of: audio, llm, vision"),
    (ModelSpec("ok", "", "llm", options={"mib": 1}), BadInput, "ref"),
    (ModelSpec("ok", "x", "llm", keep_alive_s=-1, options={"mib": 1}), BadInput, "keep_alive_s"),
    (ModelSpec("ok", "x", "llm", keep_alive_s=float("nan"), options={"mib": 1}), BadInput, "keep_alive_s"),
    (ModelSpec("ok", "x", "llm", options={"mib": 96}), DoesNotFit, "ok needs 96.0 MiB"),  # alone, past the reserve
])
def test_bad_specs_are_refused_with_one_line(loader, clock, bad, error, match) -> None:
    rm = manager(loader, clock)
    with pytest.raises(error, match=match) as err:
        rm.add(bad)
    assert "\n" not in str(err.value) and not rm.specs()


@pytest.mark.parametrize(("kind", "options", "match"), [
    ("llm", {"ctx": "2048"}, "option ctx='2048' must be a positive whole number"),
    ("llm", {"slots": 0}, "option slots=0 must be"),
    ("llm", {"threads": True}, "option threads=True must be"),
    ("llm", {"kv_type": "q4_0"}, "kv_type='q4_0' is not one of: f16, q8_0"),
    ("llm", {"prefix_cache_bytes": -1}, "prefix_cache_bytes=-1"),
    ("llm", {"batch": 4},
     r"unknown llm option 'batch' \(valid: ctx, slots, max_queued, threads, target, kv_type, prefix_cache_bytes, speculate\)"),
    ("llm", {"max_queued": 0}, "option max_queued=0 must be"),
    ("vision", {"ctx": 512}, "unknown vision option 'ctx'"),
    ("vision", {"batch": 1.5}, "option batch=1.5 must be"),
    ("audio", {"batch": 2}, "unknown audio option 'batch'"),
])
def test_the_default_loaders_check_options_before_anything_is_resolved(kind, options, match) -> None:
    rm = ResidencyManager(BUDGET)
    with pytest.raises(BadInput, match=match) as err:
        rm.add(ModelSpec("m", "no-such-model", kind, options=options))
    assert "\n" not in str(err.value)


def test_names_pins_and_unknown_models(loader, clock) -> None:
    rm = manager(loader, clock, spec("a", 50, pinned=True))
    with pytest.raises(BadInput, match="already added"):
        rm.add(spec("a", 1))
    with pytest.raises(DoesNotFit, match="pinned models"):  # every pinned model must fit at once
        rm.add(spec("b", 50, pinned=True))
    with pytest.raises(BadInput, match=r"unknown model 'zz' \(known: a\)"):
        with rm.acquire("zz"):
            pass
    with pytest.raises(BadInput, match="keeps the model's name"):
        rm.swap("a", spec("b", 1))
    assert rm.planned_bytes("a") == 50 * MiB


def test_remove_and_close_wait_for_leases(loader, clock) -> None:
    rm = manager(loader, clock, spec("a", 10), spec("b", 10))
    use(rm, "a", clock)
    with rm.acquire("b") as b:
        rm.remove("b")
        assert not b.closed
        rm.close()
        assert loader.loaded[0].closed and not b.closed
        with pytest.raises(EdgerunError, match="closed"):
            with rm.acquire("a"):
                pass
    assert b.closed and not rm.resident()


LLM_OPTIONS = {"ctx": 512, "kv_type": "f16", "prefix_cache_bytes": 8 * MiB, "threads": 1}


@pytest.mark.slow
def test_real_models_two_llms_and_a_classifier_under_one_plan(smollm, gemma, tmp_path) -> None:
    """The default loaders on SmolLM2, Gemma 3 and a tiny ONNX classifier, in a budget that holds both LLMs
    (libllama counted once) but not all three: evictions in LRU order, leases respected, plans equal."""
    import numpy as np

    from runtime.llm.plan import RUNTIME_OVERHEAD
    from tests.runtime.modelgen import vision_bundle

    bundle = vision_bundle(tmp_path / "clf", "onnx")
    specs = [ModelSpec("smol", "default", "llm", options=LLM_OPTIONS), ModelSpec("gemma", "gemma3-270m", "llm", options=LLM_OPTIONS),
             ModelSpec("clf", str(bundle), "vision", options={"threads": 1})]
    with ResidencyManager(4 << 30) as probe:
        for s in specs:
            probe.add(s)
        sizes = {s.name: probe.planned_bytes(s.name) for s in specs}
    budget = share_for(sizes["smol"] + sizes["gemma"] - RUNTIME_OVERHEAD)  # the two LLMs exactly
    rm = ResidencyManager(budget)
    for s in specs:
        rm.add(s)
    assert {s.name: rm.planned_bytes(s.name) for s in specs} == sizes  # planned alone: the budget does not change a plan

    def step(name: str) -> Any:
        with rm.acquire(name) as model:
            assert model.plan.total_bytes == sizes[name]  # loaded with the plan it was admitted with
            if name == "clf":
                assert len(model.predict([np.zeros((8, 8, 3), np.uint8)])[0].labels) == 5
            else:
                assert model.tokenize("hello")
            within_plan(rm)
        within_plan(rm)
        return model

    step("smol")
    step("clf")
    assert names(rm) == {"smol", "clf"}
    step("gemma")  # smol is the least recently used
    assert names(rm) == {"clf", "gemma"}
    with rm.acquire("gemma"):
        step("smol")  # gemma is older than clf but leased: clf goes
        assert names(rm) == {"gemma", "smol"}
        assert rm.used_bytes() == sizes["smol"] + sizes["gemma"] - RUNTIME_OVERHEAD
        with rm.acquire("smol"), pytest.raises(DoesNotFit, match=r"^clf needs .* resident: (gemma|smol) .*1 lease\)"):
            with rm.acquire("clf"):
                pass
    assert names(rm) == {"gemma", "smol"} and rm.stats()["evictions"] == 2
    rm.close()
    assert not rm.resident()


@pytest.mark.slow
@pytest.mark.parametrize("budget", [1 << 30, 330 * MiB, 250 * MiB])  # f16 at 8k; q8_0 KV; a shorter context
def test_an_llm_loaded_with_its_share_makes_the_plan_it_was_admitted_with(smollm, budget) -> None:
    """Only the budget given: the planner picks the context, KV type and prefix cache against the whole budget,
    and must pick the same within the model's share (the loader refuses a load whose plan differs)."""
    with ResidencyManager(budget) as rm:
        rm.add(ModelSpec("smol", "default", "llm", options={"threads": 1}))
        with rm.acquire("smol") as llm:
            assert llm.plan.total_bytes == rm.planned_bytes("smol")
            assert llm.plan.budget_bytes == share_for(rm.planned_bytes("smol")) < budget
            shape = (llm.plan.n_ctx, llm.plan.kv_type.value)
    assert shape == {1 << 30: (8192, "f16"), 330 * MiB: (8192, "q8_0"), 250 * MiB: shape}[budget]
    assert budget != 250 * MiB or shape[0] < 8192


def test_a_vision_and_an_audio_classifier_share_one_onnx_runtime(tmp_path) -> None:
    """The real classifier loaders: each loads with the plan it was admitted with, and ONNX Runtime's library
    (both run on it; the audio front end too) is counted once."""
    from runtime.classify.plan import RUNTIME_BYTES
    from tests.runtime.modelgen import vision_bundle
    from tests.runtime.test_busy_threads import _wake_word_bundle

    rm = ResidencyManager(1 << 30)
    rm.add(ModelSpec("img", str(vision_bundle(tmp_path / "img", "onnx")), "vision", options={"threads": 1, "batch": 2}))
    rm.add(ModelSpec("wake", str(_wake_word_bundle(tmp_path / "wake")), "audio", options={"threads": 1, "target": "cpu"}))
    for name in ("img", "wake"):
        with rm.acquire(name) as clf:
            assert clf.plan.total_bytes == rm.planned_bytes(name)
    ort = RUNTIME_BYTES[BackendName.ORT]
    assert rm.used_bytes() == rm.planned_bytes("img") + rm.planned_bytes("wake") - ort
    rm.close()


def test_concurrent_leases_and_evictions_never_pass_the_budget_or_close_a_model_in_use(loader, clock) -> None:
    """Eight threads lease random models of five that cannot all be resident, sweeping now and then."""
    import random

    rm = manager(loader, clock, *(spec(f"m{i}", 20 + 5 * i, keep_alive_s=2) for i in range(5)),
                 spec("pin", 10, pinned=True))
    errors: list[BaseException] = []
    refused = [0]

    def work(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(300):
                name = rng.choice(["m0", "m1", "m2", "m3", "m4", "pin"])
                try:
                    with rm.acquire(name, wait_s=rng.choice([0, 0.01])) as model:
                        within_plan(rm)
                        assert not model.closed and model.name == name
                        time.sleep(rng.random() / 2000)
                        assert not model.closed
                except DoesNotFit:
                    refused[0] += 1
                if rng.random() < 0.05:
                    clock.now += 1
                    rm.sweep()
        except BaseException as exc:  # noqa: BLE001 - reported to the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[0]
    stats = rm.stats()
    assert stats["evictions"] > 0 and all(r["leases"] == 0 for r in rm.resident())
    assert sum(1 for m in loader.loaded if not m.closed) == len(rm.resident())  # every unloaded model was closed once
    assert "pin" in names(rm) or not any(m.name == "pin" for m in loader.loaded)
    rm.close()
    assert all(m.closed for m in loader.loaded)


def test_the_spec_is_kept_as_it_was_added(loader, clock) -> None:
    options = {"mib": 10}
    rm = manager(loader, clock, ModelSpec("a", "a-v1", "llm", options=options))
    options["mib"] = 90  # the caller's dict changes afterwards: the plan and the load do not
    assert use(rm, "a", clock).budget == share_for(10 * MiB) and rm.specs()[0].options == {"mib": 10}


@pytest.mark.slow
def test_the_llm_loader_plans_and_loads_the_engine_slots_alike(smollm) -> None:
    """The slots of the spec (else Engine.load's default) reach both the planner and runtime.serving.engine.Engine.load,
    ctx per slot, so the engine runs the plan it was admitted with."""
    import inspect

    from runtime.serving.engine import Engine

    default = inspect.signature(Engine.load).parameters["slots"].default
    with ResidencyManager(1 << 30) as rm:
        rm.add(ModelSpec("two", "default", "llm", options={"slots": 2, "ctx": 512, "threads": 1}))
        rm.add(ModelSpec("dflt", "default", "llm", options={"ctx": 256, "threads": 1}))
        for name, slots, ctx in (("two", 2, 512), ("dflt", default, 256)):
            with rm.acquire(name) as engine:
                assert isinstance(engine, Engine)
                assert (engine.plan.n_slots, engine.plan.slot_ctx) == (slots, ctx)
                assert engine.plan.total_bytes == rm.planned_bytes(name)


def test_the_llm_loader_plans_and_loads_the_kv_type_the_spec_names(smollm) -> None:
    """A served model keeps the planner's KV type (f16 where it fits) unless its spec names one: q8_0 makes a slot's
    greedy text independent of what else its steps carried (drafts, other slots) at 2+ threads, at a measured 7-9 %
    of throughput at 4-8 clients (docs/benchmarks.md), so it is the operator's choice, not the default."""
    with ResidencyManager(1 << 30) as rm:
        rm.add(ModelSpec("usual", "default", "llm", options={"ctx": 512, "threads": 2}))
        rm.add(ModelSpec("stable", "default", "llm", options={"ctx": 512, "threads": 2, "kv_type": "q8_0"}))
        for name, kv in (("usual", "f16"), ("stable", "q8_0")):
            with rm.acquire(name) as engine:
                assert engine.plan.kv_type.value == kv, name
                assert engine.plan.total_bytes == rm.planned_bytes(name)
