"""An attempt's outcome in words: the sentence the log and ``runjobs -v 2`` print, and its one-word kind.

"mail.send #38 failed on attempt 2 of 4 after 3.0 s, retry in 0.9 s": the
sentence is built from the outcome's step, ending and columns, not from its
label, so each part (what happened, which attempt, how long it took, what
comes next) has one place.
"""

from __future__ import annotations

from vellum_jobs.core import clock, history, transitions
from vellum_jobs.core.models import Job
from vellum_jobs.execution.outcome import Outcome

# The kinds of outcome, as ``outcome=`` in the log and the ``--burst`` summary count them.
DONE, FAILED, CANCELLED, RETRY, SNOOZED, HANDED_BACK, DISCARDED = (
    "done", "failed", "cancelled", "retry", "snoozed", "handed-back", "discarded",
)  # fmt: skip
# How the ``--burst`` summary words each kind after its count.
KIND_WORDS = {
    DONE: "done",
    RETRY: "failed and due again later",
    SNOOZED: "snoozed (Retry)",
    HANDED_BACK: "handed back",
    FAILED: "failed",
    CANCELLED: "cancelled",
    DISCARDED: "discarded (no longer held)",
}


def kind(outcome: Outcome) -> str:
    """One word for what became of the job: ``done``, ``failed``, ``retry``..."""
    if not outcome.applied:
        return DISCARDED
    if outcome.step.transition is not transitions.RESCHEDULED:
        finished: dict[str, str] = {Job.State.DONE: DONE, Job.State.CANCELLED: CANCELLED}
        return finished.get(outcome.state, FAILED)
    if outcome.refund_attempt:
        return SNOOZED if outcome.label.startswith("retry requested") else HANDED_BACK
    return RETRY


def _seconds(value: float) -> str:
    return f"{value:.1f} s"


def _due_in(job: Job, outcome: Outcome) -> str:
    run_after = outcome.columns.get("run_after") or job.run_after
    return _seconds(max(0.0, (run_after - clock.now()).total_seconds())) if run_after else "?"


def sentence(job: Job, outcome: Outcome) -> str:
    """What became of ``job``'s attempt, for a person: its name and id, what happened, and what next."""
    # A refunded attempt is no longer in ``job.attempts`` once its write applied.
    refunded = (
        outcome.refund_attempt and outcome.applied and outcome.step.transition is transitions.RESCHEDULED
    )
    number = job.attempts + (1 if refunded else 0)
    attempt = f"attempt {number} of {job.max_attempts}"
    took = f"after {_seconds(outcome.duration)}"
    who = f"{job.name} #{job.pk}"
    if not outcome.applied:
        return (
            f"{who} ended {attempt} {took}, but its outcome ({outcome.label}) was discarded:"
            " the job is no longer held by this claim"
        )
    ignored = ", although it was asked to stop" if outcome.label.endswith("(cancellation ignored)") else ""
    what = kind(outcome)
    if what == DONE:
        return f"{who} done on {attempt} {took}{ignored}"
    if what == CANCELLED:
        if outcome.label == "superseded":
            return f"{who} superseded on {attempt} {took}: another job waits with its unique key"
        return f"{who} cancelled on {attempt} {took}"
    if what == SNOOZED:
        return f"{who} asked to retry on {attempt} {took}: due again in {_due_in(job, outcome)}, not counted"
    if what == HANDED_BACK:
        if outcome.ending == history.HANDED_BACK:
            return (
                f"{who} handed back on {attempt}: no handler for it in this process;"
                f" due again in {_due_in(job, outcome)} for a worker that knows it"
            )
        return f"{who} stopped early at shutdown on {attempt} {took}: handed back, due now, not counted"
    verb = {history.TIMED_OUT: "timed out", history.LOST: "lost its lease"}.get(
        outcome.ending or "", "failed"
    )
    if what == RETRY:
        return f"{who} {verb} on {attempt} {took}, retry in {_due_in(job, outcome)}{ignored}"
    if job.attempts >= job.max_attempts:
        return f"{who} {verb} on {attempt} {took}, no attempt left: failed{ignored}"
    return f"{who} {verb} on {attempt} {took}, not retried: failed{ignored}"
