"""The health view (the queue's figures as JSON, 503 when a ``HEALTH`` condition fails) and the metrics."""

from __future__ import annotations

import logging

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from vellum_jobs.conf import conf
from vellum_jobs.observe import figures, metrics
from vellum_jobs.observe import health as conditions

logger = logging.getLogger("vellum_jobs")

# The permissions that show the job list in the admin (change implies view there).
VIEW_JOB = "vellum_jobs.view_job"
CHANGE_JOB = "vellum_jobs.change_job"
REFUSED = (
    f"staff with the {VIEW_JOB} permission only: log in as such a user, "
    "or set VELLUM_JOBS['HEALTH']['PUBLIC'] = True"
)


@never_cache
@require_safe
def health(request: HttpRequest) -> JsonResponse:
    """The figures plus ``healthy`` and ``problems``, as JSON.

    Only for staff with the *view job* permission, unless ``PUBLIC``.
    """
    settings = conf.health
    if not settings.public and not _may_view_jobs(request):
        return JsonResponse({"detail": REFUSED}, status=403)
    try:
        found = figures.collect()
        # Named in the problem, read only when there is one.
        oldest = figures.oldest_due_job() if conditions.waited_too_long(found, settings) else None
    except DatabaseError as exc:
        # The message may name hosts and users; it goes to the log, not to the caller.
        logger.warning("health check could not read the queue; answering 503 error=%r", exc)
        return JsonResponse(
            {"healthy": False, "problems": [f"the jobs database did not answer ({type(exc).__name__})"]},
            status=503,
        )
    problems = conditions.problems(found, settings, oldest)
    body = {
        "healthy": not problems,
        "problems": problems,
        "warnings": conditions.warnings(found),
        **found,
    }
    return JsonResponse(body, status=503 if problems else 200)


@never_cache
@require_safe
def prometheus_metrics(request: HttpRequest) -> HttpResponse:
    """The figures per queue in Prometheus' text format, for the same callers as ``health``."""
    if not conf.health.public and not _may_view_jobs(request):
        return _text(REFUSED, status=403)
    if not metrics.available():
        return _text(f"the metrics need prometheus_client: {metrics.INSTALL}", status=501)
    try:
        read = metrics.read()
    except DatabaseError as exc:
        # As in health: the message may name hosts and users.
        logger.warning("metrics could not read the queue error=%r", exc)
        return _text(f"the jobs database did not answer ({type(exc).__name__})", status=503)
    body, content_type = metrics.exposition(read)
    return HttpResponse(body, content_type=content_type)


def _text(message: str, status: int) -> HttpResponse:
    return HttpResponse(f"{message}\n", content_type="text/plain; charset=utf-8", status=status)


def _may_view_jobs(request: HttpRequest) -> bool:
    """Whether the user may see the job list in the admin, which shows the same figures."""
    # request.user exists only with AuthenticationMiddleware; without it nobody is staff.
    user = getattr(request, "user", None)
    if user is None or not user.is_active or not user.is_staff:
        return False
    return bool(user.has_perm(VIEW_JOB) or user.has_perm(CHANGE_JOB))
