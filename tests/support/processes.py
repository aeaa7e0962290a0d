"""Real ``runjobs`` subprocesses for the tests, and waiting on conditions with a deadline."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from django.db import connection

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]


# A runjobs subprocess holds its jobs for 3 s, so that a test sees a killed
# worker's jobs recovered within seconds. A loaded machine can hold a heartbeat
# up that long: then a job is rightly run twice, or requeued just after a burst
# worker found nothing due. A runjobs whose test counts runs or outcomes, and is
# not about leases, gets a real one.
SHORT_LEASE = 3.0
REAL_LEASE = {"VELLUM_TEST_LEASE": "60s"}


def wait_for(condition: Callable[[], T], timeout: float = 60.0, what: str = "condition") -> T:
    """Poll ``condition`` until it returns something truthy; fail the test at the deadline.

    The default deadline is long: a passing test returns as soon as the
    condition holds, and on a loaded machine a Django process alone can take
    ten seconds to start. A test that times something says so with its own.
    """
    deadline = time.monotonic() + timeout
    pause = 0.01
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(pause)
        # Most conditions are queries: a long wait asks ten times a second, not fifty, so that
        # the tests' own polling does not take the database's and the processor's time.
        pause = min(pause * 1.5, 0.1)


def children_of(pid: int) -> set[int]:
    """The live processes whose parent is ``pid`` (Linux: read from /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):  # gone meanwhile
                state, parent = _stat(int(entry.name))[:2]
                if int(parent) == pid and state != "Z":
                    found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has)."""
    try:
        return _stat(pid)[0] != "Z"
    except OSError:
        return False


def _stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command: state, ppid, ..."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


class Runjobs:
    """A ``manage.py runjobs`` process on the test database."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.out = tempfile.TemporaryFile("w+")
        self.err = tempfile.TemporaryFile("w+")
        full_env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "VELLUM_TEST_DB_NAME": str(connection.settings_dict["NAME"]),
            "PYTHONUNBUFFERED": "1",
            "VELLUM_TEST_LEASE": f"{SHORT_LEASE}s",
            **(env or {}),
        }
        self.process = subprocess.Popen(
            # -X faulthandler: a process that will not exit is sent SIGABRT
            # and prints every thread's stack, so a hang names itself.
            [sys.executable, "-X", "faulthandler", "-m", "django", "runjobs", *args],
            cwd=ROOT,
            env=full_env,
            # Files, not pipes: a chatty worker must never block on a full pipe.
            stdout=self.out,
            stderr=self.err,
            text=True,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def wait(self, timeout: float = 30) -> int:
        """The exit code; a process still running at the deadline fails the test with its threads' stacks."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGABRT)
            self.process.wait(10)
            stacks = self.output()[1][-8000:]
            message = f"runjobs (pid {self.pid}) still running after {timeout}s:\n{stacks}"
            raise AssertionError(message) from None

    def output(self) -> tuple[str, str]:
        """What the process wrote so far to stdout and stderr."""
        texts = []
        for stream in (self.out, self.err):
            stream.seek(0)
            texts.append(stream.read())
        return texts[0], texts[1]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)


def beats(worker: Runjobs, count: int) -> None:
    """Wait until ``worker``'s row has been written ``count`` more times: that many heartbeats."""
    from vellum_jobs.core.models import Worker

    seen: set[object] = set()

    def beaten() -> bool:
        row = Worker.objects.filter(pid=worker.pid).values_list("last_heartbeat", flat=True).first()
        if row is not None:
            seen.add(row)
        return len(seen) > count

    wait_for(beaten, what=f"{count} heartbeats of pid {worker.pid}")
