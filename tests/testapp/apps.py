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
        if os.environ.get("VELLUM_TEST_SPANS"):
            # A runjobs process of the tracing tests: its spans go to this file.
            from tests.support import spanfile

            spanfile.install(os.environ["VELLUM_TEST_SPANS"])
