"""SIGTERM and SIGINT stop a worker process gracefully; a second one stops it at once.

Python runs a signal handler in the main thread between two bytecodes,
perhaps while the dispatcher there holds the lock inside ``wake``; a
handler that set that Event would wait for itself forever. So the handler
takes no lock: it writes the signal to a pipe, and a thread of its own
turns that into the stop request.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

logger = logging.getLogger("vellum_jobs")


class StopSignals:
    """Turns the first SIGTERM or SIGINT into ``request_stop()``; the second exits the process."""

    def __init__(self, request_stop: Callable[[], None], grace: float) -> None:
        self.request_stop = request_stop
        self.grace = grace  # for the log line
        self.received = 0
        self.pipe = -1  # written by the handler (install)

    def install(self) -> None:
        """Handle SIGTERM and SIGINT from now on; call it from the main thread."""
        read_fd, self.pipe = os.pipe()
        thread = threading.Thread(target=lambda: self._relay(read_fd), name="vellum-signals", daemon=True)
        thread.start()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.received += 1
        if self.received > 1:
            # The second signal means now: running jobs are left to their
            # leases, which another worker recovers once they lapse.
            os.write(2, b"vellum-jobs: second signal, exiting at once\n")
            os._exit(1)
        os.write(self.pipe, bytes([signum]))

    def _relay(self, read_fd: int) -> None:
        signum = os.read(read_fd, 1)[0]
        logger.info(
            "shutdown requested by %s: no new claims, running jobs have %.0fs to finish "
            "signal=%s grace=%.0fs",
            signal.Signals(signum).name,
            self.grace,
            signal.Signals(signum).name,
            self.grace,
        )
        self.request_stop()
