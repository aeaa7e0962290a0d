"""The whole-system randomized test: real ``runjobs`` processes under a seeded schedule of faults.

A pool of a few ``runjobs`` processes (prefetch and the event loop on, some
on a clock shifted more than a lease ahead or behind by libfaketime) runs
the jobs a ``Client`` keeps enqueueing (``tests/support/chaos_workload.py``), while
the schedule strikes them: SIGKILL, SIGSTOP and a later SIGCONT (some stops
longer than a lease), SIGTERM with a short ``--grace`` while some handlers
ignore the request to stop, and on PostgreSQL and MariaDB a restart of the
database server. A process that exits is replaced. When the time is up the
faults stop, every process is told to stop, and two fault-free workers
drain the queue. Then ``tests/support/chaos_check.py`` judges what the handlers
recorded against the table, and the ``Report`` gives the figures.

The schedule comes from one seed (``VELLUM_CHAOS_SEED``; printed at the
start): the same seed draws the same faults, jobs and clock shifts, though
where each fault lands depends on timing, so a replay is close, not exact.
``VELLUM_CHAOS_SECONDS`` sets how long the faults go on.

Nothing here fails on a slow machine: every wait is on a condition, and the
deadlines only catch a process that will not stop or a drain that makes no
progress at all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from django.db import connection

from tests.support import faketime
from tests.support.chaos_check import Findings, Sampler, Violation, check, read_records, read_rows
from tests.support.chaos_workload import Client
from tests.support.processes import SHORT_LEASE, Runjobs
from tests.support.serverlock import RESTART, restart_server
from tests.testapp import chaos_jobs
from vellum_jobs.core.models import Job

SEED = "VELLUM_CHAOS_SEED"
SECONDS = "VELLUM_CHAOS_SECONDS"

POOL = 3  # runjobs processes kept alive while faults strike
THREADS = 3
GRACES = (0.2, 0.5, 1.0, 2.0)  # --grace of each process, seconds
# Seconds between two faults, and between two server restarts (the first comes after the lower bound).
FAULT_GAP = (0.3, 2.5)
RESTART_GAP = (15.0, 45.0)
# A process still running this long after it was told to stop (SIGTERM, less any time it spent
# stopped, plus its grace) is hung; a drain that sees no job finish for this long is stuck.
STOP_DEADLINE = 60.0
DRAIN_STALL = 120.0

HUNG = "a worker did not exit after SIGTERM, or did not start"
EXITED = "a worker exited unasked, or not cleanly after SIGTERM"


def seed_from_environment() -> int:
    value = os.environ.get(SEED)
    return int(value) if value else random.SystemRandom().randrange(10**9)


def seconds_from_environment(default: float) -> float:
    value = os.environ.get(SECONDS)
    return float(value) if value else default


@dataclasses.dataclass
class Member:
    """One process of the pool."""

    runjobs: Runjobs
    shift: float
    grace: float
    told: str = ""  # "term" or "kill" once the schedule told it to go
    running_since: float = 0.0  # when it was told to stop, or resumed after that
    resume_at: float | None = None  # when a SIGCONT is due, while it is stopped
    started: bool = False  # its signal handlers are in place (it printed its banner)

    @property
    def pid(self) -> int:
        return self.runjobs.pid

    def up(self) -> bool:
        """Whether it printed its banner, which it does once SIGTERM means "stop gracefully": before
        that Python's default handler would end it at once, which is no fault of the worker's."""
        if not self.started:
            # A description of its own: reading through the one the process writes to would move
            # where the process writes next.
            with open(f"/proc/self/fd/{self.runjobs.out.fileno()}") as out:
                self.started = f"pid {self.pid}" in out.read()
        return self.started


@dataclasses.dataclass
class Report:
    seed: int
    seconds: float
    vendor: str
    directory: Path
    figures: Counter[str]
    faults: Counter[str]
    violations: list[Violation]

    def text(self) -> str:
        lines = [
            f"chaos on {self.vendor}: seed {self.seed}, {self.seconds:g} s of faults "
            f"(replay: {SEED}={self.seed} {SECONDS}={self.seconds:g}); records in {self.directory}",
            "faults: " + _counts(self.faults),
        ]
        # "attempts ended: finished" and its kin on one line: "attempts ended: finished 1393, ...".
        groups: dict[str, Counter[str]] = {}
        for name, count in self.figures.items():
            group, _, part = name.rpartition(": ")
            groups.setdefault(group or name, Counter())[part if group else ""] = count
        for group, counts in sorted(groups.items()):
            lines.append(f"{group}: {counts['']}" if list(counts) == [""] else f"{group}: {_counts(counts)}")
        kinds = Counter(v.kind for v in self.violations)
        lines.append("violations: " + (_counts(kinds) if kinds else "none"))
        for kind in kinds:
            shown = [v for v in self.violations if v.kind == kind]
            lines += [f"  {kind}: {v.detail}" for v in shown[:10]]
            if len(shown) > 10:
                lines.append(f"  ... and {len(shown) - 10} more")
        return "\n".join(lines)


def _counts(counts: Counter[str]) -> str:
    return ", ".join(f"{name} {count}" for name, count in sorted(counts.items())) or "none"


class Chaos:
    """One run: the pool, the faults, the drain, the judgement."""

    def __init__(self, seed: int, seconds: float, directory: Path) -> None:
        self.seed = seed
        self.seconds = seconds
        self.directory = directory
        self.log = directory / "handlers.jsonl"
        self.rng = random.Random(f"{seed}:faults")
        self.vendor = os.environ.get("VELLUM_TEST_DB", connection.vendor)
        self.lease = SHORT_LEASE  # the runjobs members'
        self.members: list[Member] = []
        self.faults: Counter[str] = Counter()
        self.figures: Counter[str] = Counter()
        self.violations: list[Violation] = []
        # When each process was stopped (SIGSTOP to SIGCONT), by pid: the checker's excuse for a
        # rate window that a start delayed past its gate made too full.
        self.stops: dict[int, list[tuple[float, float]]] = {}
        self.stopped_at: dict[int, float] = {}
        self.stop_client = threading.Event()
        self.stop_sampler = threading.Event()
        self.client = Client(random.Random(f"{seed}:jobs"), self.stop_client)
        self.sampler = Sampler(self.stop_sampler)
        self.restart: threading.Thread | None = None
        self.restart_error: BaseException | None = None
        self.next_restart = time.monotonic() + RESTART_GAP[0] / 2
        self.timeline = (directory / "faults.jsonl").open("a")

    # -- the run -------------------------------------------------------------

    def run(self) -> Report:
        print(f"chaos on {self.vendor}: seed {self.seed}, {self.seconds:g} s of faults", flush=True)
        self.sampler.start()
        self.client.start()
        try:
            self._strike_until(time.monotonic() + self.seconds)
            self.stop_client.set()
            self.client.join(60)
            self._end_restart()
            self._stop_all()
            self._drain()
        finally:
            self.stop_client.set()
            self.stop_sampler.set()
            for member in self.members:
                _kill(member.runjobs)
            self.sampler.join(30)
            self.timeline.close()
        if self.client.error is not None:
            raise RuntimeError("the client thread failed") from self.client.error
        connection.close()
        return self._judge()

    def _strike_until(self, end: float) -> None:
        next_fault = time.monotonic() + self.rng.uniform(*FAULT_GAP)
        while (now := time.monotonic()) < end:
            self._resume_due(now)
            self._reap(now)
            while sum(1 for m in self.members if not m.told) < POOL:
                self._start()
            if now >= next_fault:
                self._strike(now)
                next_fault = now + self.rng.uniform(*FAULT_GAP)
            time.sleep(0.02)

    def _start(self) -> None:
        shift = 0.0
        if faketime.LIBRARY:
            sign = self.rng.choices([0, 1, -1], [2, 1, 1])[0]
            shift = sign * round(self.rng.uniform(self.lease + 1, 3 * self.lease), 1)
        grace = self.rng.choice(GRACES)
        env = {chaos_jobs.LOG: str(self.log), **(faketime.shifted(shift) if shift else {})}
        process = Runjobs("--workers", str(THREADS), "--grace", f"{grace:g}", env=env)
        self.members.append(Member(process, shift, grace))
        kind = "ahead" if shift > 0 else "behind" if shift < 0 else "on time"
        self.figures[f"workers started: clock {kind}"] += 1
        self._note("start", process.pid, shift=shift, grace=grace)

    def _strike(self, now: float) -> None:
        alive = [m for m in self.members if m.runjobs.process.poll() is None]
        running = [m for m in alive if m.resume_at is None]
        calm = [m for m in running if not m.told and m.up()]
        choices: dict[str, int] = {"sigkill": 3 if alive else 0, "sigterm": 3 if calm else 0}
        choices["sigstop shorter than a lease"] = choices["sigstop longer than a lease"] = 2 if running else 0
        if connection.vendor in RESTART and self.restart is None and now >= self.next_restart:
            choices["server restart"] = 3
        kinds = [kind for kind, weight in choices.items() if weight]
        if not kinds:
            return
        kind = self.rng.choices(kinds, [choices[k] for k in kinds])[0]
        self.faults[kind] += 1
        if kind == "server restart":
            self._begin_restart()
        elif kind == "sigkill":
            member = self.rng.choice(alive)
            _kill(member.runjobs)
            member.told, member.resume_at = "kill", None
            self._note(kind, member.pid)
        elif kind == "sigterm":
            member = self.rng.choice(calm)
            member.runjobs.signal(signal.SIGTERM)
            member.told, member.running_since = "term", now
            self._note(kind, member.pid)
        else:
            member = self.rng.choice(running)
            low, high = (0.1, 0.6) if "shorter" in kind else (1.3, 2.7)
            length = self.rng.uniform(low, high) * self.lease
            member.runjobs.signal(signal.SIGSTOP)
            member.resume_at = now + length
            self.stopped_at[member.pid] = now
            self._note(kind, member.pid, seconds=round(length, 2))

    def _resume_due(self, now: float) -> None:
        for member in self.members:
            if member.resume_at is not None and now >= member.resume_at:
                self._resume(member, now)

    def _resume(self, member: Member, now: float) -> None:
        with contextlib.suppress(ProcessLookupError):
            member.runjobs.signal(signal.SIGCONT)
        member.resume_at = None
        member.running_since = max(member.running_since, now)
        if (since := self.stopped_at.pop(member.pid, None)) is not None:
            self.stops.setdefault(member.pid, []).append((since, now))

    def _reap(self, now: float) -> None:
        """Note the processes that exited, and the ones hung at shutdown; forget both."""
        for member in list(self.members):
            code = member.runjobs.process.poll()
            if code is None:
                deadline = member.running_since + member.grace + STOP_DEADLINE
                if member.told == "term" and member.resume_at is None and now > deadline:
                    self._hung(member)
                continue
            self._note("exit", member.pid, code=code, told=member.told)
            self.figures[f"worker exits: {member.told or 'unasked'} ({code})"] += 1
            if not (member.told == "kill" or (member.told == "term" and code == 0)):
                self._keep_stderr(member.runjobs)
                self.violations.append(Violation(EXITED, _exit_detail(member, code)))
            self._forget(member)

    def _hung(self, member: Member, what: str = "") -> None:
        member.runjobs.signal(signal.SIGABRT)  # -X faulthandler: every thread's stack on stderr
        with contextlib.suppress(subprocess.TimeoutExpired):
            member.runjobs.process.wait(10)
        stderr = self._keep_stderr(member.runjobs)
        text = stderr.read_text()
        notes = ", ".join(filter(None, [f"grace {member.grace:g}s", what, f"stderr in {stderr}"]))
        detail = f"pid {member.pid} ({notes})"
        self.violations.append(Violation(HUNG, f"{detail}:\n{_loop_death(text) or text[-6000:]}"))
        _kill(member.runjobs)
        self._forget(member)

    def _keep_stderr(self, process: Runjobs) -> Path:
        """A copy of the process's stderr in the run's directory."""
        path = self.directory / f"stderr-{process.pid}.txt"
        path.write_text(process.output()[1])
        return path

    def _forget(self, member: Member) -> None:
        self.members.remove(member)
        member.runjobs.out.close()
        member.runjobs.err.close()

    # -- server restarts ---------------------------------------------------------

    def _begin_restart(self) -> None:
        self._note("server restart", 0)
        gap = self.rng.uniform(*RESTART_GAP)  # drawn here: the schedule's generator is this thread's
        self.restart = threading.Thread(
            target=self._restart_server, args=(gap,), name="chaos-restart", daemon=True
        )
        self.restart.start()

    def _restart_server(self, gap: float) -> None:
        """Restart the server and wait until it answers; the next restart comes ``gap`` seconds later."""
        try:
            restart_server(timeout=120)
        except BaseException as exc:  # noqa: BLE001 - the run reports it
            self.restart_error = exc
        finally:
            connection.close()
            self.next_restart = time.monotonic() + gap
            self.restart = None

    def _end_restart(self) -> None:
        restart = self.restart
        if restart is not None:
            restart.join(180)
        if self.restart_error is not None:
            raise RuntimeError(f"the {self.vendor} server did not restart") from self.restart_error

    # -- the end -------------------------------------------------------------

    def _stop_all(self) -> None:
        """Resume the stopped processes, tell every one to stop once it is up, and wait for all of them.

        One that is not up after ``STOP_DEADLINE`` (the server answers by now) is hung at its start.
        """
        now = time.monotonic()
        for member in self.members:
            if member.resume_at is not None:
                self._resume(member, now)
        deadline = now + STOP_DEADLINE
        while self.members:
            now = time.monotonic()
            for member in list(self.members):
                if member.told or member.runjobs.process.poll() is not None:
                    continue
                if member.up():
                    member.runjobs.signal(signal.SIGTERM)
                    member.told, member.running_since = "term", now
                elif now > deadline:
                    self._hung(member, "it never printed its banner")
            self._reap(now)
            time.sleep(0.05)

    def _drain(self) -> None:
        """Two workers with no faults, until no job is queued or running, or none finishes for a long time."""
        connection.close()  # a restart may have broken this thread's connection
        drainers = [Runjobs("--workers", "4", env={chaos_jobs.LOG: str(self.log)}) for _ in range(2)]
        started = time.monotonic()
        try:
            left, progress = -1, started
            while True:
                now_left = Job.objects.filter(state__in=[Job.State.QUEUED, Job.State.RUNNING]).count()
                if now_left == 0:
                    break
                if now_left != left:
                    left, progress = now_left, time.monotonic()
                elif time.monotonic() - progress > DRAIN_STALL:
                    break  # the checker names the jobs left unfinished
                if any(d.process.poll() is not None for d in drainers):
                    break
                time.sleep(0.2)
            self.figures["drain seconds"] = round(time.monotonic() - started)
        finally:
            for drainer in drainers:
                if drainer.process.poll() is None:
                    drainer.signal(signal.SIGTERM)
            for drainer in drainers:
                try:
                    code = drainer.wait(STOP_DEADLINE)
                except AssertionError as hung:  # with its threads' stacks
                    self.violations.append(Violation(HUNG, f"a drain worker: {hung}"))
                    continue
                if code != 0:
                    member = Member(drainer, 0.0, 0.0, told="term")
                    self.violations.append(Violation(EXITED, "the drain's " + _exit_detail(member, code)))

    def _judge(self) -> Report:
        self.stop_sampler.set()
        rows = read_rows()
        for pid, since in self.stopped_at.items():  # killed while stopped
            self.stops.setdefault(pid, []).append((since, float("inf")))
        stops, by_wall = self.stops, connection.vendor == "sqlite"
        findings: Findings = check(
            read_records(self.log), rows, self.sampler.violations(rows), stops, by_wall
        )
        figures = findings.figures + self.figures
        figures["unique-key samples"] = self.sampler.samples
        figures["unique-key samples the database did not answer"] = self.sampler.failed
        for kind, count in self.client.counts.items():
            figures[f"client calls: {kind}"] = count
        return Report(
            self.seed,
            self.seconds,
            self.vendor,
            self.directory,
            figures,
            self.faults,
            self.violations + findings.violations,
        )

    def _note(self, kind: str, pid: int, **detail: Any) -> None:
        entry = {"t": round(time.monotonic(), 3), "kind": kind, "pid": pid, **detail}
        self.timeline.write(json.dumps(entry) + "\n")
        self.timeline.flush()


def _kill(process: Runjobs) -> None:
    if process.process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.process.send_signal(signal.SIGKILL)
        process.process.wait(30)


def _loop_death(stderr: str) -> str:
    """The traceback of the event loop's thread, if it died."""
    start = stderr.find("Exception in thread vellum-loop")
    return stderr[start : start + 4000] if start >= 0 else ""


def _exit_detail(member: Member, code: int) -> str:
    told = f"after {member.told}" if member.told else "unasked"
    return f"pid {member.pid} exited {code} {told}:\n{member.runjobs.output()[1][-3000:]}"


def run(seed: int, seconds: float, directory: Path) -> Report:
    """A run of ``seconds`` of faults from ``seed``, its records in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    return Chaos(seed, seconds, directory).run()
