"""The example's one view: add a library and queue its scan, in one transaction."""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest, HttpResponseRedirect
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from .jobs import scan_library
from .models import Library


@require_POST
def add_library(request: HttpRequest) -> HttpResponseRedirect:
    with transaction.atomic():
        library = Library.objects.create(name=request.POST["name"], path=request.POST["path"])
        scan = scan_library.using(ref=library).enqueue(library.pk)
    # The scan's page in the admin, to watch it run.
    return redirect("admin:vellum_jobs_job_change", scan.pk)
