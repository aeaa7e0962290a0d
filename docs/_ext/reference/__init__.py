"""The generated parts of the reference pages, as MyST Markdown read from the code.

One module per page: ``settings`` reads ``conf.DEFAULTS``, ``commands``
each command's own ``create_parser()``, ``checks`` the calls that build
system check messages (found in the package's source with ``ast``),
``states`` ``transitions.TRANSITIONS``, ``fields`` a model's fields and
``actions`` the admin's actions. The Sphinx extension
(``docs/_ext/vellum_reference.py``) puts their Markdown into the pages and
``tests/documentation/test_docs_reference.py`` reads the very same strings, so what the
code has and the reference lacks fails the build and a test.

What the code cannot say, a sentence about each setting and each check,
lives in tables in ``settings`` and ``checks``. A key the code has and a
table lacks, or the other way round, raises ``Incomplete``. Nothing here
imports Sphinx, so the tests run without it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import vellum_jobs

PACKAGE = Path(vellum_jobs.__file__).resolve().parent


class Incomplete(Exception):
    """The code has something the reference does not describe, or the reference describes what is gone."""


def complete(what: str, described: Mapping[str, object], keys: Iterable[str]) -> None:
    """Raise ``Incomplete`` unless ``described`` has exactly ``keys``."""
    missing, gone = set(keys) - set(described), set(described) - set(keys)
    if missing or gone:
        raise Incomplete(
            f"{what}: not described: {', '.join(sorted(missing)) or '-'}; "
            f"described but not in the code: {', '.join(sorted(gone)) or '-'}"
        )
