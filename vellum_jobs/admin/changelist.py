"""The job list's ``ChangeList``: a page without its heavy columns; references, the reasons queued
jobs wait and the errors' last lines fetched in bulk; a count that reads "10,000+" once it stops counting.
"""

from __future__ import annotations

from typing import Any

from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.formats import number_format

from vellum_jobs.admin import explanations, failures, references, search
from vellum_jobs.admin.pagination import CappedPaginator

# Columns the list never shows; a traceback or a result can be many kilobytes.
HEAVY_COLUMNS = ("args", "kwargs", "result", "error", "attempt_errors", "task_runs")


class JobChangeList(ChangeList):
    def get_filters_params(self, params: Any = None) -> Any:
        # The link that searches every job is the search's, not a filter.
        lookup_params = super().get_filters_params(params)
        lookup_params.pop(search.SEARCH_ALL, None)
        return lookup_params

    def get_filters(self, request: HttpRequest) -> Any:
        # PostgreSQL refuses a NUL character in a text parameter, and no job
        # column holds one; the admin then answers as for any bad filter.
        params = self.get_filters_params()
        if any("\x00" in value for values in params.values() for value in values):
            raise IncorrectLookupParameters("a filter value holds a NUL character")
        return super().get_filters(request)

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Any]:
        return super().get_queryset(request, exclude_parameters).defer(*HEAVY_COLUMNS)

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        self.result_list = list(self.result_list)
        references.attach(self.result_list, self.model_admin.admin_site, request)
        explanations.attach(self.result_list)
        failures.attach(self.result_list)

    @property
    def count_capped(self) -> bool:
        return isinstance(self.paginator, CappedPaginator) and self.paginator.capped

    @property
    def as_shown(self) -> JobChangeList | ShownCount:
        """This list for Django's pagination and action templates, which print ``result_count``."""
        if not isinstance(self.paginator, CappedPaginator) or not self.paginator.capped:
            return self
        return ShownCount(self, f"{number_format(self.paginator.limit, force_grouping=True)}+")


class ShownCount:
    """A ``ChangeList`` whose ``result_count`` is text, for templates only (the view keeps the number)."""

    def __init__(self, changelist: JobChangeList, text: str) -> None:
        self._changelist = changelist
        self.result_count = text

    def __getattr__(self, name: str) -> Any:
        return getattr(self._changelist, name)
