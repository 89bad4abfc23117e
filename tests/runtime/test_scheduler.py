"""runtime.serving.scheduler without HTTP: ordering, aging, preemption choice and requeue, deadlines, cancellation, bounds.

A fake clock drives every time-dependent case, so nothing here sleeps except the one cross-thread wake-up.
"""

from __future__ import annotations

import sys
import threading
import time

import pytest

from runtime.errors import BadInput, Cancelled, QueueFull
from runtime.serving.scheduler import Job, Priority, Scheduler
from tests.test_layering import ROOT, imports_of

URG, INT, BAT = Priority.URGENT, Priority.INTERACTIVE, Priority.BATCH


class Clock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _sched(**kw) -> tuple[Scheduler, Clock, list[tuple[str, str]]]:
    clock = Clock()
    sched = Scheduler(clock=clock, **kw)
    dropped: list[tuple[str, str]] = []
    sched.on_drop = lambda job, reason: dropped.append((job.payload, reason))
    return sched, clock, dropped


def _drain(sched: Scheduler) -> list[str]:
    out = []
    while (job := sched.pop()) is not None:
        out.append(job.payload)
    return out


def test_urgent_before_interactive_before_batch_and_fifo_within_a_class() -> None:
    sched, clock, _ = _sched()
    for name, prio in [("b1", BAT), ("i1", INT), ("u1", URG), ("b2", BAT), ("i2", INT), ("u2", URG), ("i3", INT)]:
        sched.submit(Job(name, prio))
        clock.t += 0.1  # older work of a worse class still waits (far from aging)
    assert sched.depth() == {URG: 2, INT: 3, BAT: 2} and len(sched) == 7
    assert sched.best_waiting() == URG
    assert _drain(sched) == ["u1", "u2", "i1", "i2", "i3", "b1", "b2"]
    assert sched.best_waiting() is None and len(sched) == 0


def test_a_waiting_batch_job_ages_past_new_interactive_work_but_never_past_urgent() -> None:
    sched, clock, _ = _sched(aging_s=5.0)
    sched.submit(Job("old-batch", BAT))
    clock.t += 4.0  # not yet aged: fresh interactive work still goes first
    sched.submit(Job("i1", INT))
    assert sched.best_waiting() == INT
    assert sched.pop().payload == "i1"
    clock.t += 1.0  # waited 5 s: treated as interactive, and older than anything interactive arriving now
    sched.submit(Job("i2", INT))
    sched.submit(Job("u1", URG))
    clock.t += 1000.0  # however long it waits, it never passes an urgent job
    sched.submit(Job("u2", URG))
    assert _drain(sched) == ["u1", "u2", "old-batch", "i2"]


def test_aging_counts_in_whole_periods_and_can_be_turned_off() -> None:
    sched, clock, _ = _sched(aging_s=float("inf"))
    sched.submit(Job("b", BAT))
    clock.t += 1e6
    sched.submit(Job("i", INT))
    assert _drain(sched) == ["i", "b"]


def _running(sched: Scheduler, clock: Clock, *specs: tuple[str, Priority, bool]) -> dict[str, Job]:
    """Submit and pop jobs one by one, a second apart, so each has its own start time."""
    jobs = {}
    for name, prio, preemptible in specs:
        sched.submit(Job(name, prio, preemptible=preemptible))
        clock.t += 1.0
        jobs[name] = sched.pop()
        assert jobs[name].payload == name
    return jobs


def test_choose_victim_only_for_a_waiting_urgent_job_and_only_a_preemptible_batch_one() -> None:
    sched, clock, _ = _sched(aging_s=60.0)
    run = _running(sched, clock, ("b-old", BAT, True), ("b-new", BAT, True), ("i", INT, True), ("b-pinned", BAT, False))
    running = list(run.values())
    assert sched.choose_victim(running) is None  # nothing waits
    sched.submit(Job("i-waiting", INT))
    assert sched.choose_victim(running) is None  # interactive work waits: nobody is preempted for it
    sched.submit(Job("u", URG))
    # the most recently started preemptible batch job: not the interactive one, not the non-preemptible one
    assert sched.choose_victim(running) is run["b-new"]
    assert sched.choose_victim([run["i"], run["b-pinned"]]) is None


def test_a_batch_job_stays_a_victim_after_aging_until_preempted_max_preemptions_times() -> None:
    # Aged batch work filling every slot must not make an urgent request wait for whole answers (it did: urgent
    # TTFT of 23-87 s under load); the bound on preemptions is what keeps the batch job from starving.
    sched, clock, _ = _sched(aging_s=5.0)
    sched.submit(Job("aged", BAT))
    clock.t += 6.0
    aged = sched.pop()
    assert aged.admitted_as == INT and aged.priority == BAT
    for _ in range(sched.max_preemptions):
        sched.submit(Job("u", URG))
        assert sched.choose_victim([aged]) is aged
        sched.requeue(aged)
        assert sched.pop().payload == "u"
        assert sched.pop() is aged
    sched.submit(Job("u", URG))
    assert aged.preemptions == sched.max_preemptions
    assert sched.choose_victim([aged]) is None  # preempted enough: it finishes now


def test_requeue_puts_the_victim_at_the_front_of_its_class_even_at_the_bound() -> None:
    sched, clock, _ = _sched(max_queued={BAT: 2})
    run = _running(sched, clock, ("victim", BAT, True))
    sched.submit(Job("b1", BAT))
    sched.submit(Job("b2", BAT))
    with pytest.raises(QueueFull):
        sched.submit(Job("b3", BAT))
    sched.submit(Job("u", URG))
    victim = sched.choose_victim(list(run.values()))
    assert victim is run["victim"]
    sched.requeue(victim)  # never refused, even though the batch queue is full
    assert sched.depth()[BAT] == 3
    assert _drain(sched) == ["u", "victim", "b1", "b2"]


def test_an_expired_queued_job_is_taken_out_and_reported_as_deadline() -> None:
    sched, clock, dropped = _sched()
    sched.submit(Job("late", URG, deadline=clock.t + 1.0))
    sched.submit(Job("fine", BAT, deadline=clock.t + 100.0))
    sched.submit(Job("open", BAT))
    clock.t += 1.0  # the deadline is reached: expired
    assert sched.best_waiting() == BAT  # the expired urgent job no longer counts
    assert sched.pop().payload == "fine"
    assert dropped == [("late", "deadline")]
    assert len(sched) == 1


def test_a_cancelled_queued_job_is_taken_out_and_reported_as_cancelled_before_pop_returns() -> None:
    sched, _, _ = _sched()
    order: list[str] = []
    sched.on_drop = lambda job, reason: order.append(f"{job.payload}:{reason}")
    first = Job("gone", INT)
    sched.submit(first)
    sched.submit(Job("next", INT))
    first.cancel()
    assert first.is_cancelled
    job = sched.pop()
    order.append(f"popped {job.payload}")
    assert order == ["gone:cancelled", "popped next"]


def test_sweep_answers_deadlines_while_nothing_is_popped() -> None:
    sched, clock, dropped = _sched()
    sched.submit(Job("a", INT, deadline=clock.t + 2.0))
    sched.submit(Job("b", BAT, deadline=clock.t + 5.0))
    clock.t += 3.0
    assert [j.payload for j in sched.sweep()] == ["a"]
    assert dropped == [("a", "deadline")] and len(sched) == 1


def test_queue_full_at_the_per_class_bound_and_a_cancelled_job_frees_its_place() -> None:
    sched, _, dropped = _sched(max_queued={INT: 2, "batch": 1})
    held = Job("i1", INT)
    sched.submit(held)
    sched.submit(Job("i2", INT))
    with pytest.raises(QueueFull) as err:
        sched.submit(Job("i3", INT))
    assert err.value.exit_code == 8 and err.value.retry_after > 0
    assert "interactive queue is full (2 queued)" in str(err.value) and "\n" not in str(err.value)
    sched.submit(Job("b1", BAT))  # another class has its own bound
    sched.submit(Job("u1", URG))  # a class left out of the mapping keeps the default bound
    held.cancel()
    sched.submit(Job("i3", INT))  # the cancelled job no longer holds a place
    assert dropped == [("i1", "cancelled")]
    assert sched.depth() == {URG: 1, INT: 2, BAT: 1}


def _full_retry_after(sched: Scheduler, prio: Priority) -> float:
    with pytest.raises(QueueFull) as err:
        while True:
            sched.submit(Job("x", prio))
    return err.value.retry_after


def test_retry_after_follows_the_recent_service_rate() -> None:
    sched, clock, _ = _sched(max_queued=2)
    for _ in range(40):  # one job every 0.1 s
        clock.t += 0.1
        sched.note_served(0.1)
    fast = _full_retry_after(sched, INT)
    assert fast == pytest.approx(0.1)
    for _ in range(40):  # the recent window now says one job every 2 s
        clock.t += 2.0
        sched.note_served(2.0)
    assert _full_retry_after(sched, BAT) == pytest.approx(2.0 * (1 + 2))  # the 2 queued interactive jobs go first
    assert sched.service_rate() == pytest.approx(0.5)


def test_retry_after_counts_parallel_workers_and_batches() -> None:
    sched, clock, _ = _sched(max_queued=1)
    for _ in range(10):  # two workers, each finishing one 1 s job per second, half a second apart
        clock.t += 0.5
        sched.note_served(1.0)
        clock.t += 0.5
        sched.note_served(1.0)
    assert sched.service_rate() == pytest.approx(2.0, rel=0.1)
    other, clock2, _ = _sched(max_queued=1)
    for _ in range(10):  # one worker, a batch of 4 per second
        clock2.t += 1.0
        other.note_served(1.0, jobs=4)
    assert other.service_rate() == pytest.approx(4.0)
    assert _full_retry_after(other, URG) == pytest.approx(0.25)


def test_retry_after_counts_busy_time_not_the_idle_gaps_between_jobs() -> None:
    sched, clock, _ = _sched(max_queued=1)
    for _ in range(10):  # 0.2 s jobs, one every 30 s: the service rate while busy is 5 per second
        clock.t += 30.0
        sched.note_served(0.2)
    assert sched.service_rate() == pytest.approx(5.0)
    assert _full_retry_after(sched, INT) == pytest.approx(0.2)


@pytest.mark.parametrize("text, want", [("urgent", URG), ("Interactive", INT), (" BATCH\n", BAT), (BAT, BAT)])
def test_priority_parse(text: str, want: Priority) -> None:
    assert Priority.parse(text) is want


@pytest.mark.parametrize("text", ["high", "", "0", "urgentt"])
def test_priority_parse_refuses_unknown_names_listing_the_valid_ones(text: str) -> None:
    with pytest.raises(BadInput) as err:
        Priority.parse(text)
    message = str(err.value)
    assert message == f"unknown priority {text!r}; valid: urgent, interactive, batch" and "\n" not in message


@pytest.mark.parametrize("kw, fragment", [
    ({"max_queued": 0}, "max_queued for urgent must be a positive integer"),
    ({"max_queued": {7: 3}}, "max_queued key 7 is not a priority; valid: urgent, interactive, batch"),
    ({"max_queued": {"low": 3}}, "unknown priority 'low'; valid: urgent, interactive, batch"),
    ({"aging_s": 0}, "aging_s must be a positive number"),
])
def test_bad_settings_are_one_line(kw: dict, fragment: str) -> None:
    with pytest.raises(BadInput, match=fragment):
        Scheduler(**kw)


def test_wait_wakes_a_worker_when_work_arrives_and_close_cancels_the_queue() -> None:
    sched, _, dropped = _sched()
    assert sched.wait(0.01) is False
    timer = threading.Timer(0.02, lambda: sched.submit(Job("w", INT)))
    timer.start()
    assert sched.wait(5.0) is True
    timer.join()
    sched.submit(Job("v", BAT))
    assert [j.payload for j in sched.close()] == ["w", "v"]
    assert dropped == [("w", "cancelled"), ("v", "cancelled")]
    start = time.monotonic()
    assert sched.wait(5.0) is False  # returns at once once closed
    assert time.monotonic() - start < 1.0
    with pytest.raises(Cancelled):
        sched.submit(Job("late", INT))
    sched.requeue(Job("preempted", BAT))  # a victim put back after close is answered, not kept forever
    assert dropped[-1] == ("preempted", "cancelled") and len(sched) == 0


def test_concurrent_submitters_and_poppers_lose_and_duplicate_nothing() -> None:
    sched = Scheduler(max_queued=10_000)
    popped: list[int] = []
    lock = threading.Lock()
    n_threads, per_thread = 4, 300

    def produce(k: int) -> None:
        for i in range(per_thread):
            sched.submit(Job(k * per_thread + i, Priority(i % 3)))

    def consume() -> None:
        while len(popped) < n_threads * per_thread:
            job = sched.pop()
            if job is None:
                sched.wait(0.01)
                continue
            with lock:
                popped.append(job.payload)

    threads = [threading.Thread(target=produce, args=(k,)) for k in range(n_threads)]
    threads += [threading.Thread(target=consume) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert sorted(popped) == list(range(n_threads * per_thread))


def test_the_scheduler_and_batcher_use_no_http_and_no_asyncio_and_errors_stays_a_leaf() -> None:
    allowed = set(sys.stdlib_module_names) - {"asyncio", "http", "socket", "socketserver"}
    for name in ("scheduler", "batcher"):
        for imp in imports_of(ROOT / "runtime" / "serving" / f"{name}.py", ROOT):
            top = imp.module.split(".")[0]
            assert top in allowed or imp.module in ("runtime.errors", "runtime.serving.scheduler"), str(imp)
    assert all(imp.module.split(".")[0] in sys.stdlib_module_names and imp.module.split(".")[0] != "runtime"
               for imp in imports_of(ROOT / "runtime" / "errors.py", ROOT))


def test_a_job_cancelled_while_pop_runs_is_not_served_in_place_of_the_one_chosen() -> None:
    """Job.cancel() takes no lock: a head cancelled between pop's clean-up and its choice must not make pop take
    out the wrong job (the cancelled one silently, the chosen one left queued to be served twice)."""
    sched, _, dropped = _sched()
    head, second = Job("head", INT), Job("second", INT)
    sched.submit(head)
    sched.submit(second)
    clean_up = sched._take_out_dead

    def then_another_thread_cancels_the_head(now: float) -> list:
        out = clean_up(now)
        head.cancel()  # the interleaving: another thread's cancel lands right after the clean-up
        return out

    sched._take_out_dead = then_another_thread_cancels_the_head
    assert sched.pop().payload == "second"
    sched._take_out_dead = clean_up
    assert sched.pop() is None  # "second" was served once, not left queued
    assert dropped == [("head", "cancelled")] and len(sched) == 0
