"""The benchmarks' jobs: a no-op, so the figures are the queue's own cost, waits, and the soak run's job."""

from __future__ import annotations

import asyncio
import os
import time
import zlib

from vellum_jobs import Fail, current_job, job


@job("bench.noop")
def noop(i: int = 0) -> None:
    return None


@job("bench.stamped")
def stamped(i: int = 0) -> None:
    """A no-op that notes when its handler started (the host's clock) in the file
    ``VELLUM_BENCH_STARTS`` names: the rate drain counts the handlers' own starts."""
    with open(os.environ["VELLUM_BENCH_STARTS"], "a") as starts:
        starts.write(f"{time.time()!r}\n")


@job("bench.pause")
def pause(seconds: float) -> None:
    """A short job that waits: a backlog that keeps a worker busy for a while, or a thread blocked on I/O."""
    time.sleep(seconds)


@job("bench.pause_async")
async def pause_async(seconds: float) -> None:
    """``pause`` as a coroutine: it waits on the worker's event loop, as a job awaiting a reply would."""
    await asyncio.sleep(seconds)


def fate(n: int) -> tuple[str, int]:
    """What soak job ``n``'s handler does, the same in every run: (kind, attempts that raise first).

    85 % succeed at once, 7 % fail once and 4 % twice before succeeding (retried),
    4 % fail permanently.
    """
    bucket = zlib.crc32(str(n).encode()) % 100
    if bucket < 85:
        return "ok", 0
    if bucket < 92:
        return "flaky", 1
    if bucket < 96:
        return "flaky", 2
    return "poison", 0


_log_fd: int | None = None


def _record(line: str) -> None:
    """Append to the soak's execution log: one write(2) to an O_APPEND file, so lines never interleave
    and survive a SIGKILL of this process right after."""
    global _log_fd
    if _log_fd is None:
        _log_fd = os.open(os.environ["VELLUM_SOAK_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_log_fd, line.encode())


@job("bench.soak", max_attempts=10, backoff=0.2)
def soak(n: int) -> None:
    this = current_job()
    assert this is not None  # a handler always runs inside its job
    _record(f"{this.pk} {this.attempts} {os.environ.get('VELLUM_SOAK_TOKEN', '-')}\n")
    time.sleep(float(os.environ.get("VELLUM_SOAK_JOB_MS", "2")) / 1000)  # so kills land mid-job too
    kind, failures = fate(n)
    if kind == "poison":
        raise Fail("soak: poison job")
    if this.attempts <= failures:
        raise RuntimeError(f"soak: flaky job, attempt {this.attempts}")


@job("bench.batch_report")
def batch_report(counts: dict[str, int]) -> dict[str, int]:
    """A batch's ``on_done`` callback: hands back the counts it was given, for the benchmark to check."""
    return counts


# The sustained-load run's job: attempts before it ends, by the share of the jobs.
SUSTAINED_ATTEMPTS = 3


def sustained_fate(n: int) -> tuple[float, int]:
    """What sustained-load job ``n``'s handler does, the same in every run: (seconds it sleeps,
    attempts that raise first).

    It sleeps 1-50 ms (25.5 ms on average). 1 % raise on their first attempt
    and are retried: 0.9 % succeed on the second, 0.1 % raise on every
    attempt and end ``failed``.
    """
    h = zlib.crc32(f"sustained {n}".encode())
    bucket = (h // 50) % 1000
    failures = 0 if bucket >= 10 else 1 if bucket < 9 else SUSTAINED_ATTEMPTS
    return (1 + h % 50) / 1000, failures


@job("bench.sustained", max_attempts=SUSTAINED_ATTEMPTS, backoff=1.0)
def sustained(n: int) -> None:
    seconds, failures = sustained_fate(n)
    time.sleep(seconds)
    this = current_job()
    if this is not None and this.attempts <= failures:
        raise RuntimeError(f"sustained: job {n} fails attempt {this.attempts}")
