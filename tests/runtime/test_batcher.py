"""runtime.serving.batcher.DynamicBatcher: batch size and wait limits, failures per batch, deadlines, close, priorities.

The worker is held inside ``run`` by a gate where a case needs work to pile up; no sleep is longer than 50 ms.
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import Future

import pytest

from runtime.errors import BackendError, BadInput, Cancelled, DeadlineExceeded, QueueFull
from runtime.serving.batcher import DynamicBatcher
from runtime.serving.scheduler import Priority

WAIT = 5.0  # seconds any result may take on a loaded machine


class Gated:
    """A ``run`` that records its batches and blocks inside the batch holding "hold" until released."""

    def __init__(self, fn=lambda x: x) -> None:
        self.fn = fn
        self.batches: list[list] = []
        self.holding = threading.Event()
        self.release = threading.Event()

    def __call__(self, items: list) -> list:
        self.batches.append(list(items))
        if "hold" in items:
            self.holding.set()
            assert self.release.wait(WAIT)
        return [self.fn(x) for x in items]

    def hold(self, batcher: DynamicBatcher) -> Future:
        future = batcher.submit("hold")
        assert self.holding.wait(WAIT)
        return future


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_burst_runs_in_batches_of_max_batch_and_results_map_back() -> None:
    run = Gated(lambda x: x * 10)
    with DynamicBatcher(run, max_batch=4, max_wait_ms=5000) as batcher:  # full batches go at once, not after 5 s
        start = time.monotonic()
        futures = [batcher.submit(i) for i in range(8)]
        assert [f.result(WAIT) for f in futures] == [i * 10 for i in range(8)]
        assert time.monotonic() - start < 2.5
        assert run.batches == [[0, 1, 2, 3], [4, 5, 6, 7]]
        stats = batcher.stats()
    assert (stats["batches"], stats["items"], stats["mean_batch_size"]) == (2, 8, 4.0)


def test_a_lone_item_runs_after_max_wait_and_not_before() -> None:
    ran_at: list[float] = []

    def run(items: list) -> list:
        ran_at.append(time.monotonic())
        return items

    with DynamicBatcher(run, max_batch=8, max_wait_ms=40) as batcher:
        submitted = time.monotonic()
        assert batcher.submit("alone").result(WAIT) == "alone"
    assert len(ran_at) == 1 and ran_at[0] - submitted >= 0.040


def test_items_that_arrive_within_max_wait_join_the_first_ones_batch() -> None:
    run = Gated()
    with DynamicBatcher(run, max_batch=2, max_wait_ms=5000) as batcher:  # the batch fills before the window ends
        first = batcher.submit("a")
        time.sleep(0.02)  # the worker already holds "a"
        second = batcher.submit("b")
        assert (first.result(WAIT), second.result(WAIT)) == ("a", "b")
    assert run.batches == [["a", "b"]]


def test_results_map_back_to_their_futures_under_concurrent_submitters() -> None:
    batches: list[int] = []

    def run(items: list) -> list:
        batches.append(len(items))
        return [(x, x * x) for x in items]

    results: dict[int, tuple] = {}

    def client(seed: int) -> None:
        rng = random.Random(seed)
        mine = [rng.randrange(10**9) for _ in range(40)]
        futures = [(x, batcher.submit(x, priority=Priority(rng.randrange(3)))) for x in mine]
        for x, f in futures:
            results[x] = f.result(WAIT)

    with DynamicBatcher(run, max_batch=5, max_wait_ms=2, max_queued=1000) as batcher:
        threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT * 4)
    assert len(results) == 160 and all(value == (x, x * x) for x, value in results.items())
    assert max(batches) <= 5 and sum(batches) == 160


def test_run_raising_fails_only_that_batchs_futures() -> None:
    boom = ValueError("the model broke")

    def run(items: list) -> list:
        if "bad" in items:
            raise boom
        return [x.upper() for x in items]

    with DynamicBatcher(run, max_batch=2, max_wait_ms=5000) as batcher:
        futures = [batcher.submit(x) for x in ("ok1", "bad", "ok2", "ok3")]
        for f in futures[:2]:
            assert f.exception(WAIT) is boom
        assert [f.result(WAIT) for f in futures[2:]] == ["OK2", "OK3"]
        assert batcher.submit("later", priority=Priority.URGENT)  # the worker survived
        stats = batcher.stats()
    assert stats["failed_batches"] == 1


def test_run_returning_the_wrong_number_of_results_is_a_backend_error() -> None:
    with DynamicBatcher(lambda items: items[:-1], max_batch=2, max_wait_ms=5000, name="digits") as batcher:
        futures = [batcher.submit(x) for x in (1, 2)]
        for f in futures:
            err = f.exception(WAIT)
            assert isinstance(err, BackendError) and str(err) == "digits: run() returned 1 results for a batch of 2"


def test_an_item_already_past_its_deadline_fails_without_being_queued_or_run() -> None:
    run = Gated()
    clock = Clock()
    with DynamicBatcher(run, max_batch=4, max_wait_ms=0, clock=clock) as batcher:
        late = batcher.submit("late", deadline=clock.t)
        assert isinstance(late.exception(0), DeadlineExceeded)
        assert batcher.submit("fine", deadline=clock.t + 1).result(WAIT) == "fine"
    assert run.batches == [["fine"]]


def test_an_item_that_expires_while_queued_fails_without_running() -> None:
    run = Gated()
    clock = Clock()
    with DynamicBatcher(run, max_batch=1, max_wait_ms=0, clock=clock) as batcher:
        held = run.hold(batcher)
        expiring = batcher.submit("expiring", deadline=clock.t + 1.0)
        kept = batcher.submit("kept", deadline=clock.t + 100.0)
        clock.t += 2.0
        run.release.set()
        err = expiring.exception(WAIT)
        assert isinstance(err, DeadlineExceeded) and err.exit_code == 9
        assert (held.result(WAIT), kept.result(WAIT)) == ("hold", "kept")
        assert batcher.stats()["expired"] == 1
    assert run.batches == [["hold"], ["kept"]]


def _collecting(batcher: DynamicBatcher) -> None:
    """Wait until the worker has taken the queued item and is collecting a batch around it."""
    deadline = time.monotonic() + WAIT
    while len(batcher.scheduler) and time.monotonic() < deadline:
        time.sleep(0.001)
    assert not len(batcher.scheduler)


def test_an_item_that_expires_while_its_batch_is_collected_fails_without_running() -> None:
    run = Gated()
    clock = Clock()
    with DynamicBatcher(run, max_batch=2, max_wait_ms=60_000, clock=clock) as batcher:
        expiring = batcher.submit("expiring", deadline=clock.t + 1.0)
        _collecting(batcher)
        clock.t += 2.0
        filler = batcher.submit("filler")  # fills the batch: it runs now
        assert isinstance(expiring.exception(WAIT), DeadlineExceeded)
        assert filler.result(WAIT) == "filler"
    assert run.batches == [["filler"]]


def test_an_item_cancelled_while_its_batch_is_collected_is_not_run() -> None:
    run = Gated()
    clock = Clock()
    with DynamicBatcher(run, max_batch=2, max_wait_ms=60_000, clock=clock) as batcher:
        dropped = batcher.submit("dropped")
        _collecting(batcher)
        assert dropped.cancel()
        assert batcher.submit("filler").result(WAIT) == "filler"
    assert run.batches == [["filler"]]


def test_close_cancels_queued_futures_and_lets_the_running_batch_finish() -> None:
    run = Gated()
    batcher = DynamicBatcher(run, max_batch=1, max_wait_ms=0)
    held = run.hold(batcher)
    queued = [batcher.submit(x) for x in ("q1", "q2", "q3")]
    closer = threading.Thread(target=batcher.close)
    closer.start()
    for f in queued:  # answered while the running batch is still held: close does not wait for the queue
        err = f.exception(WAIT)
        assert isinstance(err, Cancelled) and err.exit_code == 10
    run.release.set()
    closer.join(WAIT)
    assert not closer.is_alive()
    assert held.result(0) == "hold"
    assert run.batches == [["hold"]]
    with pytest.raises(Cancelled):
        batcher.submit("after")


def test_a_future_cancelled_by_its_caller_is_not_run_and_frees_its_place() -> None:
    run = Gated()
    with DynamicBatcher(run, max_batch=1, max_wait_ms=0, max_queued=1) as batcher:
        run.hold(batcher)
        dropped = batcher.submit("dropped")
        assert dropped.cancel()
        kept = batcher.submit("kept")  # the queue holds one item: the cancelled one no longer counts
        run.release.set()
        assert kept.result(WAIT) == "kept"
    assert run.batches == [["hold"], ["kept"]]


def test_priority_order_inside_the_queue() -> None:
    run = Gated()
    with DynamicBatcher(run, max_batch=1, max_wait_ms=0) as batcher:
        run.hold(batcher)
        futures = [batcher.submit(name, priority=prio) for name, prio in [
            ("b1", Priority.BATCH), ("i1", Priority.INTERACTIVE), ("u1", Priority.URGENT),
            ("i2", Priority.INTERACTIVE), ("u2", Priority.URGENT)]]
        run.release.set()
        for f in futures:
            f.result(WAIT)
    assert run.batches == [["hold"], ["u1"], ["u2"], ["i1"], ["i2"], ["b1"]]


def test_queue_full_is_raised_at_once_with_a_retry_after() -> None:
    run = Gated()
    with DynamicBatcher(run, max_batch=1, max_wait_ms=0, max_queued=2) as batcher:
        run.hold(batcher)
        batcher.submit("q1")
        batcher.submit("q2")
        with pytest.raises(QueueFull) as err:
            batcher.submit("q3")
        assert err.value.retry_after > 0
        batcher.submit("u", priority=Priority.URGENT)  # the urgent class has its own places
        assert batcher.stats()["queued"] == {"urgent": 1, "interactive": 2, "batch": 0}
        run.release.set()


@pytest.mark.parametrize("kw, fragment", [
    ({"max_batch": 0}, "max_batch must be a positive integer"),
    ({"max_wait_ms": -1}, "max_wait_ms must be a number of milliseconds"),
    ({"max_queued": 0}, "max_queued for urgent must be a positive integer"),
])
def test_bad_settings_are_one_line(kw: dict, fragment: str) -> None:
    with pytest.raises(BadInput, match=fragment):
        DynamicBatcher(lambda items: items, **kw)


def test_check_room_refuses_a_full_class_before_its_item_is_made() -> None:
    # The server asks before it decodes an image: a full queue must refuse then, not after the decode was paid for.
    run = Gated()
    with DynamicBatcher(run, max_batch=1, max_wait_ms=0, max_queued=1) as batcher:
        run.hold(batcher)
        batcher.check_room(Priority.INTERACTIVE)  # room: nothing queued yet
        queued = batcher.submit("q1")
        with pytest.raises(QueueFull, match="interactive queue is full") as err:
            batcher.check_room(Priority.INTERACTIVE)
        assert err.value.retry_after > 0
        batcher.check_room("urgent")  # another class keeps its own places
        queued.cancel()  # a cancelled item holds no place
        batcher.check_room(Priority.INTERACTIVE)
        run.release.set()
