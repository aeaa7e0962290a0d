"""What runs a worker's claimed jobs, seen as one: its slot threads and, if it has one, its event loop.

The dispatcher claims for each apart (a coroutine job goes to the loop, any
other to the threads) and hands each its claim's jobs; everything else, the
held attempts whose leases the heartbeat renews, the outcomes handed back,
how many are busy, it asks of both together here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from vellum_jobs.core.attempts import Attempt
from vellum_jobs.core.models import Job
from vellum_jobs.execution.outcome import Outcome
from vellum_jobs.worker.event_loop import EventLoop
from vellum_jobs.worker.slots import Slots


class Runners:
    def __init__(self, threads: Slots, loop: EventLoop | None) -> None:
        self.threads = threads
        self.loop = loop

    @property
    def async_capacity(self) -> int:
        return self.loop.capacity if self.loop is not None else 0

    def start(self) -> None:
        self.threads.start()  # the loop starts with its first job

    def stop(self, wait: bool) -> None:
        if self.loop is not None:
            self.loop.stop()
        self.threads.stop(wait=wait)

    def held_attempts(self) -> list[Attempt]:
        held = self.threads.held_attempts()
        return held + self.loop.held_attempts() if self.loop is not None else held

    def busy(self) -> int:
        return self.threads.busy() + self.async_busy()

    def async_busy(self) -> int:
        return self.loop.busy() if self.loop is not None else 0

    def has_finished(self) -> bool:
        return self.threads.has_finished() or (self.loop is not None and self.loop.has_finished())

    def take_finished(self) -> tuple[list[tuple[Attempt, Outcome]], int, int]:
        """The outcomes handed back so far, the idle threads and the tasks the loop may still start."""
        batch, idle = self.threads.take_finished()
        if self.loop is None:
            return batch, idle, 0
        more, free = self.loop.take_finished()
        return batch + more, idle, free

    def submit(self, jobs: list[Job], coroutines: Sequence[Job] = ()) -> list[Attempt]:
        """Hand ``jobs`` to the threads and ``coroutines`` (the loop's claim) to the loop; their attempts."""
        attempts = self.threads.submit(jobs)
        if coroutines:
            assert self.loop is not None
            attempts += self.loop.submit(list(coroutines))
        return attempts

    def release(self, attempts: list[Attempt]) -> None:
        self.threads.release(attempts)
        if self.loop is not None:
            self.loop.release(attempts)

    def ask_to_stop(self) -> None:
        self.threads.ask_to_stop()
        if self.loop is not None:
            self.loop.ask_to_stop()

    def cancel(self, attempts: Iterable[Attempt]) -> None:
        """Stop the coroutine jobs among ``attempts``, whose cancellation was requested (a thread
        learns of its own through ``should_stop()``)."""
        if self.loop is not None:
            self.loop.cancel(attempts)

    # Asked of the threads alone: the loop claims nothing ahead.

    def take_waiting(self, claimed_before: float | None = None) -> list[Attempt]:
        return self.threads.take_waiting(claimed_before)

    def waiting_ids(self) -> list[int]:
        return self.threads.waiting_ids()

    def longest_run(self, now: float) -> float:
        return self.threads.longest_run(now)
