"""What every system's benchmark module shares: its command line, its output and small timing helpers.

A module measures one system on one database and prints one JSON object per
figure and round on stdout (``benchmarks.run`` collects them). A figure the
system cannot produce is printed once with ``unavailable`` and the reason,
so the table says why instead of leaving a gap.
"""

from __future__ import annotations

import argparse
import json
import random
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from typing import Any

Figure = Callable[[argparse.Namespace], dict[str, Any]]
DATABASES = ("sqlite", "postgresql", "mariadb")


def parser(description: str | None, figures: Iterable[str]) -> argparse.ArgumentParser:
    result = argparse.ArgumentParser(description=description)
    result.add_argument("--db", default="sqlite", choices=DATABASES)
    result.add_argument("--figures", default=",".join(figures), help="comma-separated; default: all")
    result.add_argument("--rounds", type=int, default=3)
    result.add_argument("--jobs", type=int, default=5000, help="jobs per drain")
    result.add_argument("--samples", type=int, default=30, help="jobs per latency round")
    return result


def emit(system: str, db: str, figure: str, **fields: Any) -> None:
    print(json.dumps({"system": system, "db": db, "figure": figure, **fields}), flush=True)


def run_figures(
    system: str,
    args: argparse.Namespace,
    figures: Mapping[str, Figure],
    lacks: Mapping[str, str] | None = None,
) -> None:
    """Each requested figure, ``args.rounds`` times; a figure the system lacks is reported with why."""
    for figure in args.figures.split(","):
        if figure not in figures:
            emit(system, args.db, figure, unavailable=(lacks or {}).get(figure, f"{system} has no {figure}"))
            continue
        for round_ in range(args.rounds):
            try:
                emit(system, args.db, figure, round=round_, **figures[figure](args))
            except Exception as error:  # noqa: BLE001 - one broken figure must not hide the others
                traceback.print_exc()
                emit(system, args.db, figure, unavailable=f"failed: {type(error).__name__}: {error}"[:300])
                break


def unavailable(system: str, args: argparse.Namespace, reason: str) -> None:
    for figure in args.figures.split(","):
        emit(system, args.db, figure, unavailable=reason)


def until(
    condition: Callable[[], Any], timeout: float, what: str = "benchmark condition", pause: float = 0.002
) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout}s")
        time.sleep(pause)
    return value


def rate(count: int, seconds: float) -> dict[str, Any]:
    return {"value": count / seconds, "unit": "jobs/s", "jobs": count}


def enqueue_rate(enqueue: Callable[[int], object], count: int) -> dict[str, Any]:
    """Jobs per second of ``enqueue(0)`` ... ``enqueue(count - 1)``, one call after another."""
    started = time.perf_counter()
    for i in range(count):
        enqueue(i)
    return rate(count, time.perf_counter() - started)


def latency(delays_ms: list[float]) -> dict[str, Any]:
    """Median and 95th percentile of pickup delays in milliseconds."""
    delays = sorted(delays_ms)
    return {
        "value": delays[len(delays) // 2],
        "p95": delays[max(0, int(len(delays) * 0.95) - 1)],
        "unit": "ms",
        "samples": len(delays),
    }


# Seeded, so every run spaces its samples alike.
_GAPS = random.Random(1)


def gap() -> None:
    """Wait a random 0.1-1.1 s between latency samples.

    A worker that polls every second would otherwise be asked at the same phase
    of its poll each time, and show either almost no latency or a whole interval.
    """
    time.sleep(_GAPS.uniform(0.1, 1.1))
