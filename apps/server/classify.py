"""POST /v1/classify?model=NAME[&top=K]: an image (Content-Type image/*) or a WAV (audio/wav) body in, labels and
scores out, through a vision or audio bundle. Requests to one model are batched by runtime.serving.batcher.DynamicBatcher
(up to limits.classify_batch items or limits.classify_wait_ms after the first, whichever comes first).

A body is decoded only once it has a place: the batcher's queue for its class has room (else 429) and one of the
server's limits.decode_slots is free within DECODE_WAIT_S (else 429 with Retry-After; the slots are counted in the memory plan, see
apps.server.models). An image is decoded at no more than the model needs (runtime.classify.preprocess.load_rgb's ``need``)
and refused with 413 when even that is over limits.max_image_pixels."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from apps.server import openai_api as api
from apps.server.outcome import Outcome, log_refused
from apps.server.request import client_of, deadline_of, priority_of, route_model
from apps.server.security import ApiKey, BodyTooLarge, read_body
from apps.server.state import ServerState
from runtime.bundle.manifest import ModelKind
from runtime.classify.classifier import DEFAULT_TOP_K
from runtime.errors import BadInput, EdgerunError, QueueFull
from runtime.residency.spec import ResidentKind
from runtime.serving.batcher import DynamicBatcher

WAV_TYPES = ("audio/wav", "audio/x-wav", "audio/wave", "audio/vnd.wave")
MAX_TOP = 1000
DECODE_WAIT_S = 2.0  # how long a request waits for a decode slot before its 429
DECODE_RETRY_S = 1.0  # Retry-After when every decode slot is busy: one decode within the pixel bound takes less


class DecodeSlots:
    """At most ``n`` bodies decoded at once in one server. A request waits up to ``wait_s`` for one (in a worker
    thread: a decode within the pixel bound takes milliseconds, so a burst of clients sent together is decoded in
    turn and still batched together); one that finds none free by then is refused (429)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._free = threading.BoundedSemaphore(n)

    @contextlib.contextmanager
    def hold(self, wait_s: float = 0.0) -> Any:
        if not self._free.acquire(timeout=wait_s) if wait_s > 0 else not self._free.acquire(blocking=False):
            raise QueueFull(f"all {self.n} decode slots are busy (limits.decode_slots); retry after {DECODE_RETRY_S:g} s",
                            DECODE_RETRY_S)
        try:
            yield
        finally:
            self._free.release()


_slots: weakref.WeakKeyDictionary[ServerState, DecodeSlots] = weakref.WeakKeyDictionary()
_slots_lock = threading.Lock()


def _decode_in_slot(slots: DecodeSlots, body: bytes, kind: str, model: Any, max_pixels: int) -> Any:
    """:func:`decode` once one of ``slots`` is free (a worker thread waits up to DECODE_WAIT_S for it)."""
    with slots.hold(DECODE_WAIT_S):
        return decode(body, kind, model, max_pixels)


def decode_slots(state: ServerState) -> DecodeSlots:
    """The decode slots of the server ``state`` (made on first use, sized by its limits.decode_slots)."""
    with _slots_lock:
        found = _slots.get(state)
        if found is None:
            found = _slots[state] = DecodeSlots(state.config.limits.decode_slots)
        return found


def body_kind(content_type: str) -> ResidentKind:
    media = content_type.split(";", 1)[0].strip().lower()
    if media.startswith("image/"):
        return ResidentKind.VISION
    if media in WAV_TYPES:
        return ResidentKind.AUDIO
    raise BadInput(f"Content-Type {media[:60] or '(none)'!r} cannot be classified: send an image (image/png, image/jpeg...) "
                   f"or a WAV file ({WAV_TYPES[0]})")


def _top(text: str | None) -> int:
    if text is None:
        return DEFAULT_TOP_K
    # ASCII digits only: "²".isdigit() is true but int("²") fails, and int() would take "١٢" or " 12".
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text[:6]) <= MAX_TOP:
        raise BadInput(f"top {text[:20]!r} is not valid: use an integer from 1 to {MAX_TOP}")
    return int(text)


def decode(body: bytes, kind: ResidentKind, model: Any, max_pixels: int) -> Any:
    """The body as the model's input: RGB pixels (no more than the model needs; ImageTooLarge past ``max_pixels``)
    or audio at the model's rate, through the same decoders and checks as files on the command line (they read
    files, so the body is written to a private temporary one)."""
    if not body:
        raise BadInput("the request body is empty: send the image or WAV file itself as the body")
    with tempfile.TemporaryDirectory(prefix="edgerun-classify-") as folder:
        path = Path(folder) / ("body.wav" if kind == ResidentKind.AUDIO else "body.img")
        path.write_bytes(body)
        try:
            if kind == ResidentKind.AUDIO:
                from runtime.classify.audio_frontend import load_audio

                return load_audio(path, model.spec.sample_rate)
            from runtime.classify.preprocess import load_rgb, needed_side

            return load_rgb(path, need=needed_side(model.spec), max_pixels=max_pixels)
        except BadInput as exc:
            from runtime.classify.preprocess import ImageTooLarge

            message = str(exc).replace(str(path), "the request body")
            if isinstance(exc, ImageTooLarge):
                raise BodyTooLarge(f"{message} (limits.max_image_pixels)") from None
            raise BadInput(message) from None


def make_batcher(name: str, model: Any, kind: ResidentKind, limits: Any) -> DynamicBatcher:
    if kind == ResidentKind.VISION:
        def run(items: list[tuple[Any, int]]) -> list[Any]:
            k = max(top for _, top in items)
            predictions = model.predict([image for image, _ in items], k)
            return [p.to_dict()["labels"][:top] for p, (_, top) in zip(predictions, items, strict=True)]
    else:
        def run(items: list[tuple[Any, int]]) -> list[Any]:
            return [model.classify(audio, "body", top).to_dict() for audio, top in items]
    return DynamicBatcher(run, max_batch=limits.classify_batch, max_wait_ms=limits.classify_wait_ms,
                          max_queued=limits.max_queued, name=f"classify-{name}")


async def classify(request: Request, state: ServerState, key: ApiKey | None) -> Response:
    limits = state.config.limits
    rid = api.new_id("cls")
    client = client_of(request, key)
    try:
        kind = body_kind(request.headers.get("content-type", ""))
        public = request.query_params.get("model")
        if public is None:
            raise BadInput("model is missing: POST /v1/classify?model=NAME with the image or WAV as the body")
        served = route_model(state, public)
        top = _top(request.query_params.get("top"))
        priority = priority_of(request, request.query_params.get("priority"), key)
        deadline = deadline_of(request, None, limits.deadline_ms)
    except EdgerunError as exc:
        log_refused(rid, exc, client)
        raise
    outcome = Outcome(state, rid, public, served, priority, client=client)
    try:
        body = await read_body(request, limits.max_body_bytes)
        model_kind = state.models.kinds.get(served)
        if model_kind != kind:
            what = "an image" if kind == ResidentKind.VISION else "a WAV file"
            noun = ModelKind(model_kind).noun if model_kind in {k.value for k in ModelKind} else "not a classifier"
            raise BadInput(f"model {public!r} is {noun}; "
                           f"it cannot classify {what}")
        with contextlib.ExitStack() as lease:  # a load on demand runs off the event loop
            model = await run_in_threadpool(lease.enter_context, state.models.acquire(served))
            batcher = state.batcher(served, model, lambda: make_batcher(served, model, kind, limits))
            batcher.check_room(priority)  # a full queue refuses before the decode is paid for
            item = await run_in_threadpool(_decode_in_slot, decode_slots(state), body, kind, model, limits.max_image_pixels)
            future = batcher.submit((item, top), priority=priority, deadline=deadline)
            result = await asyncio.wrap_future(future)
    except EdgerunError as exc:
        outcome.finish(error=exc)
        raise
    outcome.finish()
    out = {"id": rid, "object": "classification", "model": public}
    out.update({"labels": result} if kind == ResidentKind.VISION else {k: v for k, v in result.items() if k != "input"})
    return JSONResponse(out)
