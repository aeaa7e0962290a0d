"""The test settings with automatic retention on, for ``runjobs`` subprocesses that prune."""

from __future__ import annotations

from tests import settings
from tests.settings import *  # noqa: F403

VELLUM_JOBS = {**settings.VELLUM_JOBS, "RETENTION": {"done": "1h"}}
