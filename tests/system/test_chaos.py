"""The whole-system randomized test (``tests/support/chaos.py``), bounded for ``make test``; and its checker.

``make chaos`` runs it for minutes on each database; ``VELLUM_CHAOS_SEED``
replays a run, ``VELLUM_CHAOS_SECONDS`` sets its length.
"""

from __future__ import annotations

import pytest

from tests.support import chaos, faketime

# Restarts the server (PostgreSQL, MariaDB): other runs on it wait (tests/support/serverlock.py).
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.restarts_server,
    pytest.mark.chaos,
]

faketime.require()

# Seconds of faults in `make test` (a server restart at most, on PostgreSQL and MariaDB): with the
# start and the drain, under a minute per database. `make chaos` runs six minutes per database.
BOUNDED = 20.0


def test_no_schedule_of_faults_breaks_a_promise(tmp_path):
    seconds = chaos.seconds_from_environment(BOUNDED)
    report = chaos.run(chaos.seed_from_environment(), seconds, tmp_path / "chaos")
    print(report.text())
    assert report.violations == [], report.text()
