"""Database calls that get no answer: how long each of a worker's own calls has waited, and a
watch that reports the first one to wait ``MAX_DATABASE_WAIT``.

A network path that keeps a connection open but forwards nothing (a stuck
middlebox or proxy) raises no error: the TCP keepalives are answered and
every byte is acknowledged, so a thread that sent a statement waits in a
socket read that no timeout of the driver or the kernel ends, and that
nothing in the process can interrupt. The lease watch (``heartbeat``) stops
the claims and asks the handlers to stop, but the dispatcher and the
heartbeat would never come back: the process would neither work nor exit.
So each of their calls is marked while it waits (``Calls.waiting``), and a
thread that never touches the database (``Watch``) reports the first one
that waited past the limit; the worker then exits, for its process manager
to start a fresh process whose new connections may take a working path.

An error is an answer: a database that refuses connections or fails
statements makes every call short, and the worker retries as it always
did. Time in which the watch itself did not run, because the process was
stopped (SIGSTOP, a paused VM) or starved, does not count as waiting: a
process that was frozen mid-call gets its answer once it runs again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

# A watch that wakes this much later than it asked was not running meanwhile.
LATE = 1.0


class Calls:
    """The database calls the worker's own threads are waiting on, and since when (``clock``'s seconds)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._waiting: dict[int, tuple[str, float]] = {}  # by thread: what, and since when

    @contextlib.contextmanager
    def waiting(self, what: str) -> Iterator[None]:
        """Mark this thread as waiting on the database for ``what`` until the block ends, however it ends.

        Within another mark of the same thread, the outer one stands.
        """
        thread = threading.get_ident()
        with self._lock:
            outer = thread in self._waiting
            if not outer:
                self._waiting[thread] = (what, self.clock())
        try:
            yield
        finally:
            if not outer:
                with self._lock:
                    del self._waiting[thread]

    def timed(self, what: str, action: Callable[[], T]) -> Callable[[], T]:
        """``action``, each call of it marked as waiting for ``what`` (for ``transient.retry``, whose
        backoff between two calls is no wait for an answer)."""

        def marked() -> T:
            with self.waiting(what):
                return action()

        return marked

    def longest(self) -> tuple[str, float] | None:
        """The call that has waited longest, and for how many seconds; None while none waits."""
        now = self.clock()
        with self._lock:
            marks = list(self._waiting.values())
        if not marks:
            return None
        what, since = min(marks, key=lambda mark: mark[1])
        return what, now - since

    def not_running(self, start: float, end: float) -> None:
        """The process did not run from ``start`` to ``end``: that time is no call's wait."""
        with self._lock:
            for thread, (what, since) in self._waiting.items():
                self._waiting[thread] = (what, min(since + (end - start), end))


class Watch:
    """A thread that calls ``on_silence(what, waited)`` once a call in ``calls`` has waited ``limit``
    seconds; it looks at least every ``every`` seconds, and never touches the database."""

    def __init__(
        self, calls: Calls, limit: float, every: float, on_silence: Callable[[str, float], None]
    ) -> None:
        self.calls = calls
        self.limit = limit
        self.every = every
        self.on_silence = on_silence
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="vellum-silence-watch", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(5)

    def look(self, asked: float) -> float:
        """Report a call that waited too long, the watch having asked to wake at ``asked``; returns
        how long it may sleep before the next look."""
        now = self.calls.clock()
        if now - asked > LATE:
            self.calls.not_running(asked, now)
        longest = self.calls.longest()
        if longest is None:
            return self.every
        what, waited = longest
        if waited >= self.limit:
            self.on_silence(what, waited)
            return self.every
        return min(self.every, self.limit - waited)

    def _run(self) -> None:
        sleep = self.every
        while True:
            asked = self.calls.clock() + sleep
            if self.stopped.wait(sleep):
                return
            sleep = self.look(asked)


def exit_now(code: int) -> None:
    """End the process with status ``code`` once the logs are written. Not ``sys.exit()``: its
    threads stuck in reads would keep a normal exit from ever finishing."""
    logger: logging.Logger | None = logging.getLogger("vellum_jobs")
    while logger is not None:
        for handler in logger.handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        logger = logger.parent if logger.propagate else None
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
