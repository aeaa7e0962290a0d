"""``runjobs --processes N``: a supervisor that keeps N ``runjobs`` processes running.

The supervisor is a plain process: no worker row, no database connection, no
threads. Each child is a fresh interpreter on the supervisor's own command
line less ``--processes`` (not a ``fork()`` of a process that may hold
connections), in a process group of its own, so a Ctrl-C at a terminal
reaches the supervisor alone and each child hears one forwarded signal, not
two (a second one would make it exit at once). The cost of that: a
supervisor killed outright does not take its children down with it. So each
child holds the read end of a pipe whose only write end the supervisor
holds; the kernel closes it however the supervisor dies, and the child, on
reading end-of-file, stops gracefully.

Signals and children's exits (SIGCHLD) reach the loop through
``signal.set_wakeup_fd``: the loop sleeps in ``select()`` until one arrives
or a delayed restart is due, and a signal that lands just before the sleep
is still in the pipe when it starts.

A stop asked for from the admin on one process's row stops the whole set:
that process sends the supervisor SIGTERM, which it forwards to every
process as if a process manager had sent it, and it exits 0 once they have
stopped. It would restart a process that stopped alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from types import FrameType

from vellum_jobs.worker.process import EXIT_SILENT, EXIT_STUCK
from vellum_jobs.worker.stop_request import SUPERVISOR

logger = logging.getLogger("vellum_jobs")

# The supervisor's status when a worker process keeps exiting soon after its start.
EXIT_GAVE_UP = 4
# In a child's environment: the file descriptor of the lifeline.
LIFELINE = "VELLUM_JOBS_LIFELINE"
# The loop wakes at least this often, whatever the pipe says.
LONGEST_SLEEP = 5.0


@dataclasses.dataclass(frozen=True)
class Restarts:
    """When a worker process that exited starts again, and when the supervisor gives up."""

    delay: float = 1.0  # before a restart, doubled for each early exit in a row (1, 2, 4 s)
    stable: float = 30.0  # a process that ran this long exited late: its count starts over
    give_up_after: int = 4  # early exits in a row of one process: stop them all, exit 4

    def delay_after(self, early_exits: int) -> float:
        return self.delay * 2.0 ** (early_exits - 1)


RESTARTS = Restarts()


@dataclasses.dataclass
class Slot:
    """One of the N places a worker process runs in, and how its processes ended."""

    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    early_exits: int = 0
    restart_at: float | None = None
    finished: bool = False  # exited 0 under --burst or --max-jobs: not started again


class Supervisor:
    """Starts ``processes`` copies of ``command`` and keeps them running; ``run()`` returns the exit code.

    ``finite``: the children exit 0 when their work is done (``--burst``,
    ``--max-jobs``), so one that does is not started again.
    """

    def __init__(
        self, command: Sequence[str], processes: int, *, finite: bool, restarts: Restarts = RESTARTS
    ) -> None:
        if processes < 1:
            raise ValueError(f"processes must be at least 1, got {processes}")
        self.command = list(command)
        self.finite = finite
        self.restarts = restarts
        self.slots = [Slot() for _ in range(processes)]
        self.signals_received = 0
        self.stopping = False
        self.killed = False
        self.exit_code = 0
        self.lifeline = -1  # the read end each child inherits

    def run(self) -> int:
        with self._signals() as wakeup, self._lifeline():
            for slot in self.slots:
                self._start(slot)
            while not self._over():
                self._sleep(wakeup)
                if not self.killed:
                    self._reap()
                    self._restart_due()
        logger.info("supervisor stopped exit_code=%d", self.exit_code)
        return self.exit_code

    def pids(self) -> list[int]:
        """The worker processes running now."""
        return [slot.process.pid for slot in self.slots if slot.process is not None]

    # -- the loop --------------------------------------------------------

    def _over(self) -> bool:
        if self.stopping:
            return not self.pids()
        return self.finite and all(slot.finished for slot in self.slots)

    def _sleep(self, wakeup: int) -> None:
        """Wait for a signal, a child's exit or the next restart; act on the signals."""
        now = time.monotonic()
        due = [slot.restart_at - now for slot in self.slots if slot.restart_at is not None]
        timeout = max(0.0, min([LONGEST_SLEEP, *due]))
        if select.select([wakeup], [], [], timeout)[0]:
            with contextlib.suppress(BlockingIOError):
                for signum in os.read(wakeup, 64):
                    if signum in (signal.SIGTERM, signal.SIGINT):
                        self._on_signal(signal.Signals(signum))

    def _on_signal(self, signum: signal.Signals) -> None:
        self.signals_received += 1
        if self.signals_received == 1:
            logger.info(
                "shutdown requested by %s: passing it on to %d runjobs processes signal=%s processes=%d",
                signum.name,
                len(self.pids()),
                signum.name,
                len(self.pids()),
            )
            self._stop(signum)
        elif not self.killed:
            self._kill()

    def _stop(self, signum: signal.Signals) -> None:
        """Forward ``signum`` to every child for a graceful stop; start none again."""
        self.stopping = True
        for slot in self.slots:
            slot.restart_at = None
            if slot.process is not None:
                slot.process.send_signal(signum)

    def _kill(self) -> None:
        """Kill every child (and whatever its handlers started) at once, as a second signal asks."""
        logger.warning("second signal, killing worker processes at once pids=%s", self.pids())
        self.killed = self.stopping = True
        self.exit_code = 1
        for slot in self.slots:
            if slot.process is None:
                continue
            try:
                os.killpg(slot.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                slot.process.kill()
            slot.process.wait()
            slot.process = None

    def _reap(self) -> None:
        for slot in self.slots:
            if slot.process is not None and (code := slot.process.poll()) is not None:
                self._exited(slot, code)

    def _exited(self, slot: Slot, code: int) -> None:
        assert slot.process is not None
        pid, ran = slot.process.pid, time.monotonic() - slot.started
        slot.process = None
        if self.stopping:
            # A child that the forwarded signal caught before it set its own
            # handlers had not claimed anything: that is a clean stop too.
            if code not in (0, -signal.SIGTERM, -signal.SIGINT) and not self.exit_code:
                self.exit_code = 1
            logger.info("worker process stopped pid=%d reason=%s", pid, describe(code))
        elif code == 0 and self.finite:
            slot.finished = True
            logger.info("worker process finished pid=%d", pid)
        else:
            self._schedule_restart(slot, pid, code, ran)

    def _schedule_restart(self, slot: Slot, pid: int, code: int, ran: float) -> None:
        slot.early_exits = slot.early_exits + 1 if ran < self.restarts.stable else 1
        if slot.early_exits >= self.restarts.give_up_after:
            logger.error(
                "worker process keeps exiting, stopping them all pid=%d reason=%s exits=%d within=%gs",
                pid,
                describe(code),
                slot.early_exits,
                self.restarts.stable,
            )
            self.exit_code = EXIT_GAVE_UP
            self._stop(signal.SIGTERM)
            return
        delay = self.restarts.delay_after(slot.early_exits)
        slot.restart_at = time.monotonic() + delay
        logger.warning(
            "worker process exited, restarting pid=%d reason=%s delay=%.1fs", pid, describe(code), delay
        )

    def _restart_due(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            if slot.restart_at is not None and slot.restart_at <= now:
                self._start(slot)

    def _start(self, slot: Slot) -> None:
        slot.process = subprocess.Popen(
            self.command,
            env={**os.environ, LIFELINE: str(self.lifeline), SUPERVISOR: str(os.getpid())},
            pass_fds=(self.lifeline,),
            process_group=0,
        )
        slot.started = time.monotonic()
        slot.restart_at = None
        logger.info("worker process started pid=%d", slot.process.pid)

    # -- plumbing --------------------------------------------------------

    @contextlib.contextmanager
    def _signals(self) -> Iterator[int]:
        """SIGTERM, SIGINT and SIGCHLD as bytes on a pipe (its read end); the old handlers back after."""
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        previous_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        previous = {signum: signal.signal(signum, _noted) for signum in _HANDLED}
        try:
            yield read
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            signal.set_wakeup_fd(previous_fd)
            os.close(read)
            os.close(write)

    @contextlib.contextmanager
    def _lifeline(self) -> Iterator[None]:
        self.lifeline, write = os.pipe()
        try:
            yield
        finally:
            os.close(self.lifeline)
            os.close(write)


_HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)


def _noted(signum: int, frame: FrameType | None) -> None:
    """The signal is already on the wakeup pipe; the loop acts on it."""


def describe(code: int) -> str:
    """A child's exit status in words: ``exit code 1``, ``killed by SIGKILL``."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    if code == EXIT_STUCK:
        return f"exit code {code} (stuck threads, --max-stuck)"
    if code == EXIT_SILENT:
        return f"exit code {code} (no answer from the database, MAX_DATABASE_WAIT)"
    return f"exit code {code}"


# -- in a child ----------------------------------------------------------


def supervised() -> bool:
    """Whether a supervisor started this process."""
    return LIFELINE in os.environ


def watch_lifeline(on_lost: Callable[[], None]) -> None:
    """In a child a supervisor started: call ``on_lost`` once that supervisor is gone."""
    fd = os.environ.pop(LIFELINE, None)
    if fd is None:
        return
    lifeline = int(fd)
    os.set_inheritable(lifeline, False)

    def watch() -> None:
        while os.read(lifeline, 1):
            pass  # nothing is written: only the end of the file means anything
        logger.warning("supervisor gone: this worker process stops")
        on_lost()

    threading.Thread(target=watch, name="vellum-lifeline", daemon=True).start()
