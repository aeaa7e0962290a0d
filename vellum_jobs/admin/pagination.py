"""A paginator that counts a few pages ahead instead of the whole filtered list.

Django's paginator runs ``COUNT(*)`` over the filtered list on every page;
on a million jobs that is the slowest query of the page. This one counts with
``SELECT COUNT(*) FROM (... LIMIT n + 1)``, which an index answers by reading
at most n + 1 entries, and shows "n+" past that. The limit grows
with the page asked for, so every page can still be reached: a far page
costs an OFFSET of that size anyway, and the count costs no more than it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.utils.functional import cached_property

# Rows counted before the list says "1,000+". A filter that an index cannot
# serve alone (a text search, state and name together) reads rows until it
# has counted this many matches, so the limit is kept small.
COUNT_LIMIT = 1_000
# How many pages past the current one the count always reaches.
PAGES_AHEAD = 5
# The largest LIMIT every vendor takes: a LIMIT past 64 bits is out of range
# on SQLite and PostgreSQL and a syntax error on MariaDB.
MAX_LIMIT = 2**63 - 2


if TYPE_CHECKING:
    PaginatorBase = Paginator[Any]
else:
    PaginatorBase = Paginator


class CappedPaginator(PaginatorBase):
    def __init__(
        self,
        object_list: QuerySet[Any] | Sequence[Any],
        per_page: int,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
        *,
        page: int = 1,
    ) -> None:
        super().__init__(object_list, per_page, orphans, allow_empty_first_page)
        # A page past the end, however far, counts the whole list once and
        # then gets what Django's admin answers for any page out of range.
        self.limit = min(MAX_LIMIT, max(COUNT_LIMIT, (page + PAGES_AHEAD) * per_page))

    @cached_property
    def count(self) -> int:
        """The number of rows, or ``limit + 1`` when there are more than ``limit``."""
        rows = self.object_list
        if isinstance(rows, QuerySet):
            return rows.order_by()[: self.limit + 1].count()
        return min(len(rows), self.limit + 1)

    @property
    def capped(self) -> bool:
        """Whether there are more rows than were counted."""
        return self.count > self.limit


def page_asked(params: Any) -> int:
    """The page number in the changelist's query string (``p``), 1 when absent or not a number."""
    try:
        return max(1, int(params.get("p", 1)))
    except (TypeError, ValueError):
        return 1
