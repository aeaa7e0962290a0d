"""The health view: the queue's figures as JSON, 503 when a ``HEALTH`` condition fails."""

from __future__ import annotations

import logging

from django.db import DatabaseError
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from vellum_jobs import health as conditions
from vellum_jobs import stats
from vellum_jobs.conf import conf

logger = logging.getLogger("vellum_jobs")


@never_cache
@require_safe
def health(request: HttpRequest) -> JsonResponse:
    """The figures plus ``healthy`` and ``problems``, as JSON; staff only unless ``PUBLIC``."""
    settings = conf.health
    if not settings.public and not _is_staff(request):
        return JsonResponse(
            {"detail": "staff only: log in as staff, or set VELLUM_JOBS['HEALTH']['PUBLIC'] = True"},
            status=403,
        )
    try:
        figures = stats.collect()
    except DatabaseError as exc:
        # The message may name hosts and users; it goes to the log, not to the caller.
        logger.warning("health check could not read the queue error=%r", exc)
        return JsonResponse(
            {"healthy": False, "problems": [f"the jobs database did not answer ({type(exc).__name__})"]},
            status=503,
        )
    problems = conditions.problems(figures, settings)
    return JsonResponse(
        {"healthy": not problems, "problems": problems, **figures}, status=503 if problems else 200
    )


def _is_staff(request: HttpRequest) -> bool:
    # request.user exists only with AuthenticationMiddleware; without it nobody is staff.
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_active and user.is_staff)
