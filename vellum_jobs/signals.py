"""Django signals sent around each job run, with ``sender=Job`` and ``job=<the Job>``."""

from __future__ import annotations

from django.dispatch import Signal

# Sent in the worker thread just before the handler is called.
job_started = Signal(use_caching=True)

# Sent after the outcome is recorded, from the thread that wrote it (on
# PostgreSQL and MariaDB the worker's recorder); ``job.state`` is the outcome
# (``queued`` again when the attempt failed and will be retried). Not sent for a stale
# outcome that the fence refused. Also sent, from the heartbeat of the process
# that recovered it, for an attempt lost with its worker (``job.error`` says so).
job_finished = Signal(use_caching=True)
