"""Soak run: many jobs through several ``runjobs`` processes while one is SIGKILLed every few seconds.

``python -m benchmarks.soak --db sqlite --jobs 100000 --processes 4``

Each job's handler (``bench.soak``) fails or succeeds as its number dictates
(see ``benchmarks.app.jobs.fate``: most succeed, some fail once or twice and
are retried, some fail permanently) and appends "job attempt process" to an
execution log before doing anything else. Every ``--kill-every`` seconds a
random worker process is SIGKILLed and a new one started. At the end the run
checks that every job is ``done`` or ``failed`` as its handler dictated, none
is left queued or running, none is lost, no attempt ran twice, and a job ran
more often than its handler asked only where a killed process interrupted
it. It prints a report and exits 1 on any violation.

``--old-code DIR`` runs every other process from DIR, a checkout of an
earlier version (``git worktree add DIR <commit>``): old and new workers side
by side on one table, as during a rolling deploy. Its schema must be the
one the current code migrated to, or one its migrations leave compatible.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import database

ROOT = Path(__file__).resolve().parent.parent
NAME = "vellum_soak_bench"


@dataclass
class Workers:
    """The runjobs processes, each started with a token that its jobs write to the execution log."""

    count: int
    log: Path
    outdir: Path
    old_code: Path | None = None  # every other process runs the code here, where given
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    killed: set[str] = field(default_factory=set)
    started: int = 0

    def start(self) -> None:
        self.started += 1
        old = self.old_code is not None and self.started % 2 == 0
        token = f"p{self.started}{'-old' if old else ''}"
        env = {
            **os.environ,
            "VELLUM_SOAK_TOKEN": token,
            "VELLUM_SOAK_LOG": str(self.log),
            "PYTHONUNBUFFERED": "1",
        }
        with open(
            self.outdir / f"{token}.log", "wb"
        ) as out:  # the child keeps its own copy of the descriptor
            self.processes[token] = subprocess.Popen(
                [sys.executable, "-m", "django", "runjobs", "--workers", "4"],
                # ``-m`` puts the working directory first on the path: the process imports
                # vellum_jobs and the benchmarks' jobs from there.
                cwd=self.old_code if old else ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def kill_one(self, rng: random.Random) -> str:
        token = rng.choice(sorted(self.processes))
        process = self.processes.pop(token)
        process.send_signal(signal.SIGKILL)
        process.wait(30)
        self.killed.add(token)
        self.start()
        return token

    def stop(self) -> list[str]:
        """SIGTERM everyone (a graceful shutdown); the tokens of those that exited non-zero."""
        from vellum_jobs.core.models import Worker

        # A process still starting has no SIGTERM handler yet: wait until each has registered.
        pids = {process.pid for process in self.processes.values()}
        until(lambda: pids <= set(Worker.objects.values_list("pid", flat=True)), 60)  # exit codes tell if not
        for process in self.processes.values():
            process.terminate()
        return [token for token, process in self.processes.items() if process.wait(120) != 0]


def until(condition: Any, timeout: float) -> bool:
    """Whether ``condition`` came true within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def setup(vendor: str) -> None:
    os.environ["VELLUM_BENCH_DB"] = vendor
    os.environ["VELLUM_BENCH_NAME"] = database.recreate(vendor, NAME)
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.soak_settings"
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def enqueue(count: int) -> None:
    from benchmarks.app.jobs import soak

    for start in range(0, count, 10_000):
        soak.enqueue_many([(n,) for n in range(start, min(start + 10_000, count))])


def unfinished() -> int:
    from vellum_jobs.core.models import Job

    return Job.objects.filter(state__in=[Job.State.QUEUED, Job.State.RUNNING]).count()


def run(args: argparse.Namespace, workers: Workers) -> tuple[float, list[str]]:
    """Start the workers, kill one every ``kill_every`` seconds until no job is left; seconds taken."""
    rng = random.Random(args.seed)
    problems = []
    started = time.monotonic()
    for _ in range(args.processes):
        workers.start()
    next_kill = started + args.kill_every
    while unfinished():
        if time.monotonic() > started + args.timeout:
            problems.append(f"timed out after {args.timeout:.0f} s with {unfinished()} jobs unfinished")
            break
        if time.monotonic() >= next_kill:
            token = workers.kill_one(rng)
            print(
                f"{time.monotonic() - started:7.1f} s  killed {token}, {unfinished()} jobs left", flush=True
            )
            next_kill += args.kill_every
        time.sleep(0.2)
    elapsed = time.monotonic() - started
    problems += [f"worker {token} exited non-zero on SIGTERM" for token in workers.stop()]
    return elapsed, problems


def read_log(log: Path) -> dict[int, list[tuple[int, str]]]:
    executions: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for line in log.read_text().splitlines():
        pk, attempt, token = line.split()
        executions[int(pk)].append((int(attempt), token))
    return executions


def verify(count: int, workers: Workers) -> dict[str, Any]:
    """Every job against its handler's fate and the execution log; the violations found."""
    from benchmarks.app.jobs import fate
    from vellum_jobs.core.models import Job

    executions = read_log(workers.log)
    rows = list(Job.objects.values_list("pk", "args", "state", "attempts", "error"))
    violations = []
    if len(rows) != count:
        violations.append(f"{len(rows)} job rows for {count} enqueued")
    interrupted = extra_runs = 0
    for pk, args, state, attempts, error in rows:
        kind, failures = fate(args[0])
        runs = executions.get(pk, [])
        killed_runs = sum(token in workers.killed for _, token in runs)
        interrupted += killed_runs
        expected_state, expected_runs = ("failed", 1) if kind == "poison" else ("done", failures + 1)
        extra_runs += max(0, len(runs) - expected_runs)
        violations += _check_job(pk, state, expected_state, error, runs, attempts, expected_runs, killed_runs)
    states = Counter(state for _, _, state, _, _ in rows)
    return {
        "states": dict(states),
        "executions": sum(len(r) for r in executions.values()),
        "executions_by_processes_later_killed": interrupted,
        "runs_beyond_the_handlers_fate": extra_runs,
        "violations": violations,
    }


def _check_job(
    pk: int,
    state: str,
    expected_state: str,
    error: str,
    runs: list[tuple[int, str]],
    attempts: int,
    expected_runs: int,
    killed_runs: int,
) -> list[str]:
    found = []
    if state != expected_state:
        found.append(f"job {pk}: {state}, its handler dictated {expected_state} ({error.splitlines()[-1:]})")
    numbers = Counter(attempt for attempt, _ in runs)
    found += [f"job {pk}: attempt {a} ran {n} times" for a, n in numbers.items() if n > 1]
    # A kill can add a run (the interrupted attempt is retried) but nothing else can.
    if len(runs) > expected_runs + killed_runs:
        found.append(
            f"job {pk}: ran {len(runs)} times, its handler asked {expected_runs}, {killed_runs} killed"
        )
    if runs and max(numbers) > attempts:
        found.append(f"job {pk}: attempt {max(numbers)} ran but the row says {attempts} attempts")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", default="sqlite", choices=["sqlite", "postgresql", "mariadb"])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--processes", type=int, default=4, help="runjobs processes, 4 threads each")
    parser.add_argument("--kill-every", type=float, default=3.0, help="seconds between SIGKILLs")
    parser.add_argument("--timeout", type=float, default=3600.0, help="give up (and fail) after this long")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--old-code", type=Path, help="a checkout of an earlier version: every other process runs it"
    )
    args = parser.parse_args()
    outdir = ROOT / "benchmarks/results/soak" / args.db
    outdir.mkdir(parents=True, exist_ok=True)
    log = outdir / "executions.log"
    log.unlink(missing_ok=True)
    setup(args.db)
    enqueue(args.jobs)
    workers = Workers(args.processes, log, outdir, old_code=args.old_code)
    elapsed, problems = run(args, workers)
    report = verify(args.jobs, workers)
    report["violations"] = problems + report["violations"]
    print_report(args, elapsed, workers, report)
    sys.exit(1 if report["violations"] else 0)


def print_report(args: argparse.Namespace, elapsed: float, workers: Workers, report: dict[str, Any]) -> None:
    rate = args.jobs / elapsed
    print(
        f"{args.jobs:,} jobs on {args.db}, {args.processes} processes: {elapsed:.0f} s ({rate:,.0f} jobs/s)"
    )
    old = f" ({workers.started // 2} of them from {workers.old_code})" if workers.old_code else ""
    print(f"SIGKILLs: {len(workers.killed)}; processes started: {workers.started}{old}")
    print(f"states: {report['states']}")
    killed_runs = report["executions_by_processes_later_killed"]
    print(f"executions: {report['executions']:,}; by processes later killed: {killed_runs}")
    print(
        f"runs beyond the handlers' fate (interrupted duplicates): {report['runs_beyond_the_handlers_fate']}"
    )
    violations = report["violations"]
    print(f"violations: {len(violations)}")
    for violation in violations[:20]:
        print(f"  {violation}")
    print(f"execution log: {workers.log}; worker output: {workers.outdir}/p*.log")


if __name__ == "__main__":
    main()
