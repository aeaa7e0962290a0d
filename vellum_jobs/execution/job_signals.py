"""Sending ``job_started`` and ``job_finished``: for an attempt, and for the jobs a maintenance duty
ended. A failing receiver is logged; it fails neither the job nor the worker."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from django.dispatch import Signal

from vellum_jobs import signals
from vellum_jobs.core.models import Job

logger = logging.getLogger("vellum_jobs")


def send(signal: Signal, job: Job) -> None:
    """Send a job signal; a failing receiver is logged, it does not fail the job or the worker."""
    if not signal.receivers:  # the usual case, and it is asked twice per job
        return
    for receiver, response in signal.send_robust(sender=Job, job=job):
        if isinstance(response, Exception):
            logger.error(
                "%s #%s: a signal receiver raised; the job's outcome stands receiver=%r job_id=%s",
                job.name,
                job.pk,
                receiver,
                job.pk,
                exc_info=response,
            )


def report_ended(alias: str, ended: Sequence[tuple[int, str]]) -> None:
    """Send ``job_finished`` for jobs a maintenance duty ended: attempts the reaper ended because
    their worker was lost, jobs failed because no live worker knew their name.

    ``ended`` pairs a job id with the state the duty left it in. A job
    that has left that state since (requeued and claimed again) is not
    reported: its next attempt's outcome is.
    """
    if not ended or not signals.job_finished.has_listeners(Job):
        return
    states = dict(ended)
    for job in Job.objects.using(alias).filter(pk__in=states):
        if job.state == states[job.pk]:
            send(signals.job_finished, job)
