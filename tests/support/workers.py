"""Workers in the test process: one that drains the queue and returns, and one running in a
thread beside the test, stopped at the end of its test come what may."""

from __future__ import annotations

import threading

from tests.support.processes import wait_for
from vellum_jobs.core.models import Worker
from vellum_jobs.worker.process import WorkerOptions, WorkerProcess

# The workers started and not yet stopped. A test that fails before its
# ``stop()`` would leave one claiming the next tests' jobs (in the test
# process: their assertions see a third worker, their signals a stranger);
# the ``background_workers_stop`` fixture of tests/conftest.py stops it.
RUNNING: set[Background] = set()


def burst(**options) -> WorkerProcess:
    """Run a ``--burst`` worker in the test process until no job is due; it must exit 0."""
    worker = WorkerProcess(WorkerOptions(burst=True, **options))
    assert worker.run() == 0
    return worker


class Background:
    """A WorkerProcess running in a thread of the test process."""

    def __init__(self, **options) -> None:
        self.worker = WorkerProcess(WorkerOptions(**options))
        self.exit_code: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        RUNNING.add(self)
        self.thread.start()
        wait_for(lambda: Worker.objects.filter(pk=self.worker.id).exists(), what="worker row")

    def _run(self) -> None:
        self.exit_code = self.worker.run()

    def stop(self, timeout: float = 30) -> int | None:
        self.worker.request_stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "worker did not stop"
        RUNNING.discard(self)
        return self.exit_code

    def join_slot_threads(self) -> None:
        """Wait for slot threads the worker left in their handlers: one that outlives its test
        touches a database the next test owns."""
        threads = self.worker.slots.threads.threads
        wait_for(lambda: not any(thread.is_alive() for thread in threads), what="the slot threads to end")


def stop_leftovers() -> None:
    """Stop the workers a test started and did not stop (it failed first)."""
    for background in list(RUNNING):
        background.stop()
