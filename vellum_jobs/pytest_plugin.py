"""The ``job_queue`` pytest fixture, loaded by pytest through the package's ``pytest11`` entry point.

Nothing here touches Django until a test asks for the fixture, so the
plugin loads before pytest-django has set Django up.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from vellum_jobs.core.models import Job


class JobQueue:
    """The test helpers of ``vellum_jobs.testing`` as methods of one object."""

    def run(self, *, queues: tuple[str, ...] = (), now: datetime | None = None) -> list[Job]:
        """Run due jobs in the test's thread and transaction; see ``testing.run_jobs``."""
        from vellum_jobs.testing import run_jobs

        return run_jobs(queues=queues, now=now)

    def enqueued(self, name: Any = None) -> list[Job]:
        from vellum_jobs.testing import enqueued_jobs

        return enqueued_jobs(name)

    def assert_enqueued(self, name: Any, /, **kwargs: Any) -> Job:
        from vellum_jobs.testing import assert_enqueued

        return assert_enqueued(name, **kwargs)

    def inline(self, enabled: bool = True) -> AbstractContextManager[None]:
        """A block in which each job runs as soon as it is enqueued."""
        from vellum_jobs.testing import run_inline

        return run_inline(enabled)


@pytest.fixture
def job_queue(db: None) -> Iterator[JobQueue]:
    """Run and inspect jobs from a test; needs (and requests) pytest-django's database access."""
    yield JobQueue()
