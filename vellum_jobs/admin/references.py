"""The objects jobs are about (``Job.ref``): fetched for a page of jobs, linked to their admin pages.

A page of a hundred jobs would cost a hundred queries through the
``GenericForeignKey``; ``attach`` fetches them with one query per model
instead. It also survives what ``prefetch_related("ref")`` does not: a
content type whose model is gone, and a stored key that no longer parses.

An object's ``str()`` can say what its admin page would (a customer's name,
an invoice's total), so it is shown only to users with the model's view or
change permission; others see the model and the id, and the object is not
fetched for them.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable

from django.contrib.admin import AdminSite
from django.contrib.admin.utils import quote
from django.contrib.auth import get_permission_codename
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import ValidationError
from django.db import models
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse
from django.utils.text import Truncator

from vellum_jobs.core.models import Job

# Where ``attach`` leaves a job's Reference for the list's column to read.
_ATTRIBUTE = "_vellum_reference"


@dataclasses.dataclass(frozen=True)
class Reference:
    label: str
    url: str | None = None


def attach(jobs: Iterable[Job], site: AdminSite, request: HttpRequest) -> None:
    """Give each of ``jobs`` its ``Reference``, fetching the objects in one query per model."""
    jobs = list(jobs)
    wanted: dict[int, set[str]] = defaultdict(set)
    for job in jobs:
        if job.ref_type_id is not None and job.ref_id:
            wanted[job.ref_type_id].add(job.ref_id)
    visible = {type_id for type_id in wanted if _may_view(request, type_id)}
    found: dict[tuple[int, str], models.Model] = {}
    for type_id in visible:
        found.update(_fetch(type_id, wanted[type_id]))
    for job in jobs:
        setattr(job, _ATTRIBUTE, _describe(job, visible, found, site, request))


def of(job: Job) -> Reference | None:
    """The Reference ``attach`` gave ``job``; None if it has none or was not given one."""
    reference: Reference | None = getattr(job, _ATTRIBUTE, None)
    return reference


def _may_view(request: HttpRequest, type_id: int) -> bool:
    """Whether the user has the view or change permission of the model of ``type_id``."""
    model = ContentType.objects.get_for_id(type_id).model_class()
    if model is None:
        return False
    opts = model._meta
    user = request.user
    return any(
        user.has_perm(f"{opts.app_label}.{get_permission_codename(action, opts)}")
        for action in ("view", "change")
    )


def _fetch(type_id: int, ref_ids: set[str]) -> dict[tuple[int, str], models.Model]:
    model = ContentType.objects.get_for_id(type_id).model_class()
    if model is None:
        return {}
    keys = {}
    for ref_id in ref_ids:
        try:
            keys[model._meta.pk.to_python(ref_id)] = ref_id
        except ValidationError:
            continue
    return {(type_id, keys[obj.pk]): obj for obj in model._default_manager.filter(pk__in=keys)}


def _describe(
    job: Job,
    visible: set[int],
    found: dict[tuple[int, str], models.Model],
    site: AdminSite,
    request: HttpRequest,
) -> Reference | None:
    if job.ref_type_id is None or not job.ref_id:
        return None
    content_type = ContentType.objects.get_for_id(job.ref_type_id)
    model = content_type.model_class()
    if model is None:
        return Reference(f"{content_type.app_label}.{content_type.model} #{job.ref_id} (model gone)")
    if job.ref_type_id not in visible:
        return Reference(f"{model._meta.label} #{job.ref_id}")
    obj = found.get((job.ref_type_id, job.ref_id))
    kind = str(model._meta.verbose_name)
    if obj is None:
        return Reference(f"{kind} #{job.ref_id} (deleted)")
    label = f"{kind}: {Truncator(str(obj)).chars(60)}"
    return Reference(label, _admin_url(obj, site, request))


def _admin_url(obj: models.Model, site: AdminSite, request: HttpRequest) -> str | None:
    """The object's change page on ``site``, if it is registered there and the user may see it."""
    model = type(obj)
    if not site.is_registered(model):
        return None
    if not site.get_model_admin(model).has_view_permission(request, obj):
        return None
    opts = model._meta
    try:
        return reverse(
            f"{site.name}:{opts.app_label}_{opts.model_name}_change",
            args=[quote(obj.pk)],
            current_app=site.name,
        )
    except NoReverseMatch:
        return None
