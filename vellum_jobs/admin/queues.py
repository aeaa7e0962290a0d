"""The queue list: which queues are paused, with actions to pause and resume them.

Queues are names on jobs, not rows, until one is paused. So that the list
shows every queue a worker serves, opening it adds the missing rows of the
queues the registry and the live workers know (an INSERT that skips
existing ones). "Add queue" pauses a queue by name; a name nobody has
used (``queues.ever_used``: most likely a typo, which would become a row
the dashboard shows for good) is refused until the form's "create it"
box is ticked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.safestring import SafeString

from vellum_jobs import queues
from vellum_jobs.admin import display
from vellum_jobs.admin.filters import QueueFilter
from vellum_jobs.core.models import Job, Queue

if TYPE_CHECKING:
    QueueAdminBase = admin.ModelAdmin[Queue]
else:
    QueueAdminBase = admin.ModelAdmin


@admin.action(permissions=["change"], description="Pause selected queues")
def pause(model_admin: QueueAdmin, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
    names = [name for name in queryset.values_list("name", flat=True) if queues.pause(name, by=_who(request))]
    model_admin.message_user(
        request, f"Paused {len(names)}: {', '.join(names) or '-'}. Running jobs finish.", messages.SUCCESS
    )


@admin.action(permissions=["change"], description="Resume selected queues")
def resume(model_admin: QueueAdmin, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
    names = [name for name in queryset.values_list("name", flat=True) if queues.resume(name)]
    model_admin.message_user(request, f"Resumed {len(names)}: {', '.join(names) or '-'}.", messages.SUCCESS)


def _who(request: HttpRequest) -> str:
    return f"admin: {request.user}"


class AddQueueForm(forms.ModelForm):  # type: ignore[type-arg]
    """The name of a queue to pause; one nobody has used needs ``create`` ticked."""

    create = forms.BooleanField(
        required=False,
        label="Create it",
        help_text="Needed for a name no job, worker or pause has used yet: most likely a typo.",
    )

    class Meta:
        model = Queue
        fields = ("name",)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        name = cleaned.get("name")
        if name and not cleaned.get("create") and not queues.ever_used(name):
            self.add_error(
                "name",
                f"No job, worker or pause has ever named queue {name!r}: check the spelling,"
                ' or tick "Create it" to pause a new queue of that name.',
            )
        return cleaned


@admin.register(Queue)
class QueueAdmin(QueueAdminBase):
    list_display = ("name", "state", "paused_at", "paused_by", "jobs")
    actions = (pause, resume)
    search_fields = ("name",)

    class Media:
        css = {"all": ("vellum_jobs/admin.css",)}

    def has_change_permission(self, request: HttpRequest, obj: Queue | None = None) -> bool:
        if obj is not None:
            return False  # pausing and resuming are the actions
        return super().has_change_permission(request)

    def get_form(
        self, request: HttpRequest, obj: Queue | None = None, change: bool = False, **kwargs: Any
    ) -> Any:
        if obj is None:
            kwargs["form"] = AddQueueForm
        return super().get_form(request, obj, change, **kwargs)

    def get_fields(self, request: HttpRequest, obj: Queue | None = None) -> tuple[str, ...]:
        return ("name", "create") if obj is None else ("name", "paused_at", "paused_by")

    def get_readonly_fields(self, request: HttpRequest, obj: Queue | None = None) -> tuple[str, ...]:
        return ("name", "paused_at", "paused_by") if obj is not None else ()

    def save_model(self, request: HttpRequest, obj: Queue, form: Any, change: bool) -> None:
        """Adding a queue pauses it."""
        obj.paused_at = timezone.now()
        obj.paused_by = _who(request)
        super().save_model(request, obj, form, change)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if request.method == "GET":
            known = QueueFilter(request, {}, Job, self).known()
            Queue.objects.bulk_create([Queue(name=name) for name in known], ignore_conflicts=True)
        return super().changelist_view(request, extra_context)

    @admin.display(description="state")
    def state(self, queue: Queue) -> SafeString:
        return display.badge("paused", "paused") if queue.is_paused else display.badge("running", "running")

    @admin.display(description="jobs")
    def jobs(self, queue: Queue) -> SafeString | str:
        try:
            url = reverse(f"{self.admin_site.name}:vellum_jobs_job_changelist")
        except NoReverseMatch:
            return display.EMPTY
        return format_html('<a href="{}?{}">its jobs</a>', url, urlencode({"queue": queue.name}))
