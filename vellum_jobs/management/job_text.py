"""Jobs as ``manage.py jobs`` prints them: a table of rows, one job's page, and an error's headline."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.utils import timezone

from vellum_jobs.core.models import Job
from vellum_jobs.observe.explain import Reason

COLUMNS = ("ID", "NAME", "STATE", "QUEUE", "ATTEMPTS", "DUE / FINISHED", "ERROR")
# The widest a name or queue cell gets before it is cut short (with "…").
NAME_WIDTH, QUEUE_WIDTH = 40, 20


def headline(error: str) -> str:
    """What went wrong in one line: a traceback's exception line, else the text's first line."""
    lines = [line.strip() for line in (error or "").splitlines() if line.strip()]
    if not lines:
        return ""
    if lines[0].startswith("Traceback (most recent call last)"):
        return lines[-1]
    return lines[0]


def moment(value: datetime | None) -> str:
    return timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def when(job: Job) -> str:
    """The time that matters for the job's state: when it is due, started, or finished."""
    if job.state == Job.State.QUEUED:
        return f"due {moment(job.run_after)}"
    if job.state == Job.State.RUNNING:
        return f"started {moment(job.started_at)}"
    return f"{job.state} {moment(job.finished_at)}"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def row(job: Job) -> tuple[str, ...]:
    return (
        str(job.pk),
        _cut(job.name, NAME_WIDTH),
        job.state,
        _cut(job.queue, QUEUE_WIDTH),
        f"{job.attempts}/{job.max_attempts}",
        when(job),
        headline(job.error),
    )


def table(jobs: Sequence[Job], width: int) -> str:
    """``jobs`` as aligned columns, the error cut to fit ``width`` characters."""
    rows = [COLUMNS, *(row(job) for job in jobs)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS) - 1)]
    room = max(20, width - sum(widths) - 2 * len(widths))
    lines = []
    for r in rows:
        cells = [cell.ljust(w) for cell, w in zip(r, widths, strict=False)]
        lines.append("  ".join([*cells, _cut(r[-1], room)]).rstrip())
    return "\n".join(lines)


def as_json(job: Job) -> dict[str, Any]:
    """A row of ``list --json``: the job's fields an operator filters on, times in ISO 8601."""

    def iso(value: datetime | None) -> str | None:
        return value.isoformat() if value else None

    return {
        "id": job.pk,
        "name": job.name,
        "state": job.state,
        "queue": job.queue,
        "priority": job.priority,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "created_at": iso(job.created_at),
        "run_after": iso(job.run_after),
        "started_at": iso(job.started_at),
        "finished_at": iso(job.finished_at),
        "error": headline(job.error),
    }


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


def _indented(text: str) -> list[str]:
    return ["  " + line for line in text.splitlines()]


def page(job: Job, reasons: Sequence[Reason]) -> str:
    """One job as ``jobs show`` prints it: its state and what to know first, then its details."""
    lines = [f"Job #{job.pk} {job.name}: {job.state}"]
    error = headline(job.error)
    if error and job.state != Job.State.DONE:
        lines.append(f"  error:     {error}")
    fields = [
        ("queue", f"{job.queue} (priority {job.priority})"),
        ("attempts", f"{job.attempts} of {job.max_attempts}"),
        ("created", moment(job.created_at)),
        ("due", moment(job.run_after)),
        ("started", moment(job.started_at)),
        ("finished", moment(job.finished_at)),
    ]
    if job.duration is not None:
        fields.append(("took", f"{job.duration.total_seconds():.1f} s"))
    if job.worker_id:
        fields.append(("worker", str(job.worker_id)))
    if job.cancel_requested_at:
        fields.append(("cancel", f"requested {moment(job.cancel_requested_at)}"))
    if job.progress_done is not None:
        total = f" / {job.progress_total}" if job.progress_total is not None else ""
        message = f" {job.progress_message}" if job.progress_message else ""
        fields.append(("progress", f"{job.progress_done}{total}{message}"))
    if job.concurrency_key:
        fields.append(("key", f"{job.concurrency_key} (at most {job.concurrency_limit} at once)"))
    fields += [("args", json.dumps(job.args, default=str)), ("kwargs", json.dumps(job.kwargs, default=str))]
    lines += [f"  {label + ':':<10} {value}" for label, value in fields]
    lines += ["Why:", *(f"  - {reason}" for reason in reasons)]
    if job.result is not None:
        lines += ["Result:", *_indented(_pretty(job.result))]
    if job.attempt_errors:
        lines.append("Attempts that did not succeed, oldest first:")
        for entry in job.attempt_errors:
            took = f" after {entry['duration']:.1f} s" if entry.get("duration") is not None else ""
            lines.append(
                f"  attempt {entry.get('attempt')}: {entry.get('outcome')} at {entry.get('ended_at')}"
                f"{took} on {entry.get('worker') or '?'}: {entry.get('error')}"
            )
    if job.error:
        lines += ["Error:", *_indented(job.error)]
    return "\n".join(lines)
