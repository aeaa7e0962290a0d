"""The randomized test's judge: what the handlers recorded, held against what the database says.

Each attempt is rebuilt from its handler's own lines (``tests/testapp/chaos_jobs.py``):
when it started, the last moment it was seen running (its end, or its last
tick), its deadline, how it ended. A time is a lower bound of how long the
handler ran, never more: a violation found from them happened.

- Two attempts of one job ran at once only if the earlier one's lease had
  lapsed, which the database records as a "worker lost" entry of that claim
  in the job's history, or if it was recorded as timed out and the later one
  started after its deadline.
- Every job ended ``done``, ``failed`` or ``cancelled``, with a reason for the
  last two; a ``done`` job's last claim is a run whose handler finished its
  work (one that returned early because it was asked to stop is partial
  work, never ``done``).
- No concurrency key ran more than its limit at once, counting the attempts
  whose lease did not lapse, each until its deadline if it timed out: the
  one ``concurrency_key`` a claim checks, and each key of ``concurrency={...}``
  that the gate checks before a handler starts (its slot is held while the
  job runs under that claim: a worker killed mid-run holds it until
  recovery requeues the job).
- No window of a rate limit's period saw more handlers of its key start than
  its count. A start is the handler's first line, a little after the gate
  let it through: a process stopped (SIGSTOP) in between starts late, and a
  window it makes too full is counted apart, not as a violation. On SQLite,
  which has no clock of its own, the gate goes by each process's wall clock,
  and so does this check (some processes run shifted); the true clock's
  count there is a figure.
- No unique key had two waiting jobs (or, held while queued or running, two
  holders): the ``Sampler`` looks at the table while the run goes on.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from django.db import DatabaseError, connection

from vellum_jobs.core import history
from vellum_jobs.core.limits import Limits
from vellum_jobs.core.models import Job

OVERLAP = "two attempts of one job ran at once"
CLAIM_TWICE = "one claim started its handler twice"
UNFINISHED = "a job did not end done, failed or cancelled"
NO_REASON = "a failed or cancelled job has no reason"
PARTIAL = "a job is done though its handler did not finish"
PARTIAL_LEASE_LOST = "a job is done though its handler stopped early, told its lease was lost"
KEY_LIMIT = "a concurrency key ran more than its limit"
RATE_LIMIT = "a rate key started more handlers than its count within its period"
TWO_WAITING = "a unique key had two waiting jobs"
TWO_HOLDERS = "a unique key held while queued or running had two holders"


@dataclasses.dataclass(frozen=True)
class Violation:
    kind: str
    detail: str


@dataclasses.dataclass
class Attempt:
    """One claim's run of a handler, from its own lines."""

    job: int
    claim: int
    attempt: int
    pid: int
    key: str
    start: float
    last: float  # the last moment it was seen running
    deadline: float | None
    how: str | None = None  # None: no end was recorded (its process died, or exited around it)
    starts: int = 1
    wall: float | None = None  # the process's wall clock at the start (shifted, for some)

    def describe(self) -> str:
        ended = self.how or "no end recorded"
        return (
            f"claim {self.claim} (attempt {self.attempt}, pid {self.pid}) ran {self.start:.3f}.."
            f"{self.last:.3f}, {ended}"
        )


def read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with path.open() as lines:
        return [json.loads(line) for line in lines if line.strip()]


def attempts_from(records: Iterable[dict[str, Any]]) -> dict[tuple[int, int], Attempt]:
    """The attempts the records describe, by (job, claim)."""
    found: dict[tuple[int, int], Attempt] = {}
    for record in sorted(records, key=lambda r: r["t"]):
        key = (record["job"], record["claim"])
        attempt = found.get(key)
        if record["e"] == "start":
            if attempt is not None:
                attempt.starts += 1
                continue
            found[key] = Attempt(
                record["job"],
                record["claim"],
                record["attempt"],
                record["pid"],
                record["key"] or "",
                record["t"],
                record["t"],
                record.get("deadline"),
                wall=record.get("wall"),
            )
        elif attempt is not None:
            attempt.last = max(attempt.last, record["t"])
            if record["e"] == "end":
                attempt.how = record["how"]
    return found


@dataclasses.dataclass
class Row:
    """What the database says of one job at the end."""

    name: str
    state: str
    error: str
    claims: int
    unique_key: str | None
    concurrency_limit: int
    entries: list[dict[str, Any]]
    limits: str = ""  # Job.limits: the rate and concurrency={...} limits the gate checks

    def ended(self, claim: int, outcome: str) -> bool:
        """Whether the history has an entry of ``outcome`` for that claim."""
        return any(e.get("claim") == claim and e.get("outcome") == outcome for e in self.entries)

    def forgotten(self, claim: int) -> bool:
        """Whether the history is full and its oldest entry is newer than that claim."""
        claims = [e.get("claim") or 0 for e in self.entries]
        return len(claims) >= history.LIMIT and min(claims) > claim


def read_rows() -> dict[int, Row]:
    fields: tuple[str, ...] = ("pk", "name", "state", "error", "claims", "unique_key", "concurrency_limit")
    fields += ("attempt_errors", "limits")
    return {
        values[0]: Row(*values[1:]) for values in Job.objects.order_by("pk").values_list(*fields).iterator()
    }


@dataclasses.dataclass
class Findings:
    violations: list[Violation] = dataclasses.field(default_factory=list)
    figures: Counter[str] = dataclasses.field(default_factory=Counter)

    def add(self, kind: str, detail: str) -> None:
        self.violations.append(Violation(kind, detail))


def check(
    records: list[dict[str, Any]],
    rows: dict[int, Row],
    sampled: list[Violation],
    stops: dict[int, list[tuple[float, float]]] | None = None,
    by_wall: bool = False,
) -> Findings:
    """Every check but the sampler's, which comes in as ``sampled``. ``stops`` are the times each
    process was stopped (SIGSTOP to SIGCONT), by pid; ``by_wall``: rates by the processes' wall
    clocks (SQLite)."""
    findings = Findings(violations=list(sampled))
    attempts = attempts_from(records)
    by_job: dict[int, list[Attempt]] = defaultdict(list)
    for attempt in attempts.values():
        by_job[attempt.job].append(attempt)
        findings.figures[f"attempts ended: {attempt.how or 'cut off'}"] += 1
        if attempt.starts > 1:
            findings.add(
                CLAIM_TWICE, f"job {attempt.job} {attempt.describe()}, started {attempt.starts} times"
            )
    findings.figures["attempts"] = len(attempts)
    for pk, runs in by_job.items():
        row = rows.get(pk)
        if row is None:
            findings.figures["attempts of jobs no longer in the table"] += len(runs)
            continue
        _check_overlaps(findings, pk, sorted(runs, key=lambda a: a.claim), row)
    for pk, row in rows.items():
        _check_end(findings, pk, row, by_job.get(pk, []))
    _check_keys(findings, attempts.values(), rows)
    _check_rates(findings, attempts.values(), rows, stops or {}, by_wall)
    findings.figures["jobs"] = len(rows)
    for row in rows.values():
        findings.figures[f"jobs {row.state}"] += 1
    return findings


def _check_overlaps(findings: Findings, pk: int, runs: list[Attempt], row: Row) -> None:
    for i, earlier in enumerate(runs):
        for later in runs[i + 1 :]:
            if later.start >= earlier.last:
                continue
            if row.ended(earlier.claim, history.LOST):
                findings.figures["overlaps after a lapsed lease"] += 1
            elif (
                row.ended(earlier.claim, history.TIMED_OUT)
                and earlier.deadline is not None
                and later.start >= earlier.deadline
            ):
                findings.figures["overlaps after a timeout"] += 1
            elif row.forgotten(earlier.claim):
                findings.figures["overlaps the history no longer tells of"] += 1
            else:
                findings.add(
                    OVERLAP,
                    f"job {pk} ({row.name}): {earlier.describe()}; {later.describe()}; "
                    f"history {_entries(row)}",
                )


def _check_end(findings: Findings, pk: int, row: Row, runs: list[Attempt]) -> None:
    if row.state not in Job.FINISHED_STATES:
        findings.add(UNFINISHED, f"job {pk} ({row.name}) is {row.state}; history {_entries(row)}")
        return
    if row.state != Job.State.DONE:
        if not row.error.strip():
            findings.add(NO_REASON, f"job {pk} ({row.name}) is {row.state}; history {_entries(row)}")
        return
    last = next((run for run in runs if run.claim == row.claims), None)
    if last is None or last.how != "finished":
        ran = last.describe() if last is not None else f"claim {row.claims} has no record"
        # Told apart from the others: the one kind of partial work the worker itself asks for.
        kind = PARTIAL_LEASE_LOST if last is not None and last.how == "stopped: lease lost" else PARTIAL
        findings.add(kind, f"job {pk} ({row.name}): {ran}; error {row.error!r}; history {_entries(row)}")


def _concurrency(attempt: Attempt, row: Row) -> list[tuple[str, int]]:
    """The concurrency keys ``attempt`` ran under, with their limits: its ``concurrency_key`` (the
    claim's) and the keys of its ``concurrency={...}`` (the gate's), told apart."""
    keys = [(f"claim {attempt.key}", row.concurrency_limit)] if attempt.key else []
    return keys + [(f"gate {key}", count) for key, count in Limits.decode(row.limits).concurrency]


def _check_keys(findings: Findings, attempts: Iterable[Attempt], rows: dict[int, Row]) -> None:
    """Sweep each key's attempts in time; an attempt counts from its start to its last sign of life
    (its deadline if it timed out), unless its lease lapsed."""
    spans: dict[str, list[tuple[float, float, Attempt]]] = defaultdict(list)
    limits: dict[str, int] = {}
    for attempt in attempts:
        row = rows.get(attempt.job)
        keys = _concurrency(attempt, row) if row is not None else []
        if not keys or row is None:
            continue
        if row.ended(attempt.claim, history.LOST):
            findings.figures["keyed attempts not counted: lease lapsed"] += 1
            continue
        end = attempt.last
        if row.ended(attempt.claim, history.TIMED_OUT) and attempt.deadline is not None:
            end = min(end, attempt.deadline)
        for key, limit in keys:
            spans[key].append((attempt.start, end, attempt))
            limits[key] = max(limits.get(key, 0), limit)
    for key, intervals in spans.items():
        limit = limits[key]
        running: list[tuple[float, float, Attempt]] = []
        for start, end, attempt in sorted(intervals, key=lambda span: span[0]):
            running = [span for span in running if span[1] > start]
            running.append((start, end, attempt))
            if len(running) > limit:
                together = "; ".join(f"job {a.job} {a.describe()}" for _, _, a in running)
                findings.add(KEY_LIMIT, f"key {key!r} (limit {limit}) at {start:.3f}: {together}")
        findings.figures["concurrency keys"] += 1


def _check_rates(
    findings: Findings,
    attempts: Iterable[Attempt],
    rows: dict[int, Row],
    stops: dict[int, list[tuple[float, float]]],
    by_wall: bool,
) -> None:
    """For each rate key, every window of its period from one start on: no more starts than its count."""
    starts: dict[tuple[str, int, float], list[Attempt]] = defaultdict(list)
    for attempt in attempts:
        row = rows.get(attempt.job)
        for key, count, period in Limits.decode(row.limits).rates if row is not None else ():
            starts[(key, count, period)].append(attempt)
    for (key, count, period), runs in starts.items():
        findings.figures["rate keys"] += 1
        findings.figures["rate-limited starts"] += len(runs)
        if by_wall:  # the gate's clock; the true one's count is a figure
            findings.figures["rate windows over the count by the true clock"] += len(
                _crowded(runs, count, period)
            )
        for crowd in _crowded(runs, count, period, by_wall):
            late = [a for a in crowd if _stopped_before(a, period, stops)]
            if len(crowd) - len(late) <= count:
                findings.figures["rate windows over the count: a start delayed by SIGSTOP"] += 1
                continue
            together = "; ".join(f"job {a.job} ({rows[a.job].name}) {a.describe()}" for a in crowd)
            times = [a.wall if by_wall and a.wall is not None else a.start for a in crowd]
            span = max(times) - min(times)
            detail = (
                f"key {key!r} ({count} per {period:g}s): {len(crowd)} starts within {span:.3f}s: {together}"
            )
            findings.add(RATE_LIMIT, detail)


def _crowded(runs: list[Attempt], count: int, period: float, by_wall: bool = False) -> list[list[Attempt]]:
    """Each window of ``period`` from a start on that holds more than ``count`` starts."""

    def at(attempt: Attempt) -> float:
        return attempt.wall if by_wall and attempt.wall is not None else attempt.start

    ordered = sorted(runs, key=at)
    crowds = []
    for i, first in enumerate(ordered):
        within = [a for a in ordered[i:] if at(a) < at(first) + period]
        if len(within) > count:
            crowds.append(within)
    return crowds


def _stopped_before(attempt: Attempt, period: float, stops: dict[int, list[tuple[float, float]]]) -> bool:
    """Whether the attempt's process was stopped within ``period`` before its start: its gate may
    have let it through well before its first line ran."""
    return any(
        begin < attempt.start and end > attempt.start - period for begin, end in stops.get(attempt.pid, [])
    )


def _entries(row: Row) -> str:
    return json.dumps(
        [{k: e.get(k) for k in ("attempt", "claim", "outcome", "error", "worker")} for e in row.entries]
    )


class Sampler(threading.Thread):
    """Looks at the waiting and running unique jobs, one statement at a time, until ``stop`` is set."""

    def __init__(self, stop: threading.Event, every: float = 0.1) -> None:
        super().__init__(name="chaos-sampler", daemon=True)
        self.stop = stop
        self.every = every
        self.samples = 0
        self.failed = 0  # samples the database did not answer (a restart)
        self.seen: dict[tuple[str, str | None, tuple[int, ...]], Violation] = {}

    def run(self) -> None:
        try:
            while not self.stop.wait(self.every):
                self.sample()
        finally:
            connection.close()

    def sample(self) -> None:
        try:
            # One statement: one snapshot of the table on every database.
            rows = list(
                Job.objects.filter(unique_key__isnull=False, state__in=[Job.State.QUEUED, Job.State.RUNNING])
                .values_list("pk", "unique_key", "unique_while", "state", "started_at")
                .order_by("pk")
            )
        except DatabaseError:
            self.failed += 1
            connection.close()
            return
        self.samples += 1
        self.look(rows)

    def look(self, rows: list[tuple[Any, ...]]) -> None:
        """Note the keys that ``rows`` (id, key, unique_while, state, started_at; by id) show held twice."""
        keys: dict[str | None, list[tuple[Any, ...]]] = defaultdict(list)
        for row in rows:
            keys[row[1]].append(row)
        for key, holders in keys.items():
            waiting = [row for row in holders if row[3] == Job.State.QUEUED]
            if len(waiting) > 1:
                self._found(TWO_WAITING, key, waiting)
            if holders[0][2] == "queued_or_running" and len(holders) > 1:
                self._found(TWO_HOLDERS, key, holders)

    def _found(self, kind: str, key: str | None, rows: list[tuple[Any, ...]]) -> None:
        ids = tuple(row[0] for row in rows)
        if (kind, key, ids) in self.seen:
            return
        described = ", ".join(
            f"job {pk} {state} (started_at {started_at})" for pk, _, _, state, started_at in rows
        )
        at = time.monotonic()
        self.seen[(kind, key, ids)] = Violation(kind, f"key {key!r} at {at:.3f}: {described}")

    def violations(self, rows: dict[int, Row]) -> list[Violation]:
        """What the samples found, each with the history of its jobs at the end."""
        found = []
        for (kind, _, ids), violation in self.seen.items():
            histories = "; ".join(f"job {pk}: {_entries(rows[pk])}" for pk in ids if pk in rows)
            found.append(Violation(kind, f"{violation.detail}; histories {histories}"))
        return found
