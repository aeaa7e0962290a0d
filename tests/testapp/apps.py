from __future__ import annotations

import os

from django.apps import AppConfig


class TestAppConfig(AppConfig):
    name = "tests.testapp"
    label = "testapp"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        if os.environ.get("VELLUM_TEST_FAULTS"):
            # A runjobs process of the fault-injection test: some of its statements fail.
            from tests.support import faultinjection

            faultinjection.install_from_environment()
        if os.environ.get("VELLUM_TEST_KILL_INSIDE"):
            # A runjobs process that must die at a chosen point (test_release_concurrency).
            from tests.support import faultinjection

            faultinjection.install_killer_from_environment()
        if os.environ.get("VELLUM_TEST_NO_RELEASE_DUTY"):
            # A runjobs process that releases waiting jobs only as it records ends: what the
            # eager release alone does (test_release_concurrency).
            from vellum_jobs.maintenance import releases

            releases.run_if_due = lambda *args, **kwargs: None
        if os.environ.get("VELLUM_TEST_SPANS"):
            # A runjobs process of the tracing tests: its spans go to this file.
            from tests.support import spanfile

            spanfile.install(os.environ["VELLUM_TEST_SPANS"])
        if os.environ.get("VELLUM_TEST_HOLD_WRITTEN"):
            # A runjobs process of the Throttled test: it notes when a hold it wrote was committed.
            from tests.testapp import limit_jobs

            limit_jobs.note_holds_written()
