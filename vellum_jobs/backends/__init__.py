"""Django's Tasks framework on vellum-jobs: ``VellumTaskBackend`` for the ``TASKS`` setting.

``django.tasks`` is new in Django 6.0. On older Django this package refuses
to import with a message that says so, instead of a bare "No module named
'django.tasks'"; the rest of vellum-jobs does not need it.
"""

from __future__ import annotations

import django

if django.VERSION < (6, 0):
    raise ImportError(
        f"vellum_jobs.backends.VellumTaskBackend needs Django 6.0 or later, the first release with "
        f"Django's Tasks framework (django.tasks); this is Django {django.get_version()}. "
        "Upgrade Django, or use vellum-jobs' own @job decorator, which works on Django 5.2."
    )

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vellum_jobs.backends.backend import VellumTaskBackend

__all__ = ["VellumTaskBackend"]


def __getattr__(name: str) -> Any:
    # The backend (and django.tasks) is imported by whoever asks for it: TASKS, when Django
    # builds its backends. The app imports only ``hooks`` from this package.
    if name == "VellumTaskBackend":
        from vellum_jobs.backends.backend import VellumTaskBackend

        return VellumTaskBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
