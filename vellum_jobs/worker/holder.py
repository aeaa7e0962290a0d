"""What the slot threads and the event loop both keep: the attempts they hold and the outcomes they hand back.

Neither writes an outcome. An attempt is held from its claim until the
dispatcher has recorded its outcome (or left it to its lease), and the
heartbeat renews the leases of every held attempt; the handler's return
hands the outcome back under the same lock, so that the dispatcher reads
the outcomes and the free capacity together.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable

from vellum_jobs.core.attempts import Attempt
from vellum_jobs.execution.outcome import Outcome


class Holder:
    def __init__(
        self, worker_id: uuid.UUID, shutdown: threading.Event, on_finish: Callable[[], None]
    ) -> None:
        self.worker_id = worker_id
        self.shutdown = shutdown
        self.on_finish = on_finish  # wakes the dispatcher
        self.lock = threading.Lock()
        self.held: dict[Attempt, None] = {}  # claimed, outcome not yet recorded (in claim order)
        self.finished: list[tuple[Attempt, Outcome]] = []
        self.running = 0  # handlers started and not yet returned

    def busy(self) -> int:
        with self.lock:
            return self.running

    def held_attempts(self) -> list[Attempt]:
        with self.lock:
            return list(self.held)

    def has_finished(self) -> bool:
        with self.lock:
            return bool(self.finished)

    def release(self, attempts: Iterable[Attempt]) -> None:
        """Stop holding ``attempts``: their outcomes are recorded (or left to their leases)."""
        with self.lock:
            for attempt in attempts:
                self.held.pop(attempt, None)

    def ask_to_stop(self) -> None:
        """Ask every held attempt's handler to stop (``should_stop()``): the worker lost its leases."""
        for attempt in self.held_attempts():
            attempt.stop.set()

    def hand_back(self, attempt: Attempt, outcome: Outcome) -> None:
        """The handler of ``attempt`` returned with ``outcome``: for the dispatcher to record."""
        attempt.returned = True
        with self.lock:
            self.running -= 1
            self.finished.append((attempt, outcome))
        self.on_finish()
