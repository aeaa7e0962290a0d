"""The job list's search box: a number finds that id; words are looked for in names and errors.

No index serves a words search: the database reads jobs newest first until
it has a page and the list's capped count. A word that few jobs hold would
read the whole table, seconds on ten million jobs, so by default a words
search reads only the newest ``JobAdmin.search_window`` ids (the jobs
enqueued last, a range of the primary key), and the list offers a link that
searches every job (``SEARCH_ALL``).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Max, Q, QuerySet
from django.http import HttpRequest
from django.utils.text import smart_split, unescape_string_literal

from vellum_jobs.core.models import Job

MAX_ID = 2**63 - 1
MAX_ID_DIGITS = len(str(MAX_ID))
# The query parameter of the link that searches every job, not only the newest.
SEARCH_ALL = "search_all"
# Where a request keeps the scope its words search was given (see ``scope_for``).
_SCOPE_ATTRIBUTE = "_vellum_search_scope"


@dataclass(frozen=True)
class Scope:
    """A words search limited to the jobs whose id is above ``above``: the newest ``window``."""

    above: int
    window: int


def as_id(term: str) -> int | None:
    """The id a search term names ("123", "#123"), or None for words."""
    number = term.strip().removeprefix("#")
    # isdecimal, not isdigit: "²" is a digit that int() refuses. The length
    # first: int() refuses more than 4,300 digits (sys.get_int_max_str_digits()).
    if number.isdecimal() and len(number.lstrip("0")) <= MAX_ID_DIGITS and int(number) <= MAX_ID:
        return int(number)
    return None


def matching(queryset: QuerySet[Job], term: str) -> QuerySet[Job]:
    """Jobs whose name or error holds every word of ``term`` ("quoted words" as one)."""
    for word in smart_split(term.strip()):
        if word[:1] in "\"'" and word[-1:] == word[:1]:
            word = unescape_string_literal(word)
        queryset = queryset.filter(Q(name__icontains=word) | Q(error__icontains=word))
    return queryset


def scope_for(request: HttpRequest, term: str, window: int, using: str) -> Scope | None:
    """The newest jobs a words search of ``request`` reads, or None when it reads every job:
    a search for an id, a search asked for all jobs, or a table with no job older than the window.

    Two primary-key lookups. The answer is kept on the request, for the
    list page's note under the search box (``kept``).
    """
    scope = None
    if term.strip() and as_id(term) is None and not request.GET.get(SEARCH_ALL):
        newest = Job.objects.using(using).aggregate(newest=Max("id"))["newest"]
        if newest is not None and Job.objects.using(using).filter(id__lte=newest - window).exists():
            scope = Scope(above=newest - window, window=window)
    setattr(request, _SCOPE_ATTRIBUTE, scope)
    return scope


def kept(request: HttpRequest) -> Scope | None:
    """The scope ``scope_for`` gave this request's words search, if it limited one."""
    scope: Scope | None = getattr(request, _SCOPE_ATTRIBUTE, None)
    return scope
