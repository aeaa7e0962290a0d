"""The Python examples of the README and the docs pages, as tests: Sybil's, one per block.

Sybil's MyST parsers read each Markdown document; every ```python block (and any
``>>>`` session inside one) becomes a pytest item named by the document and the
block's line, ``README.md::line:73,column:1``, so a failing example names its file
and line. The blocks of one document run in order in one namespace, the way a
reader types them into one shell: a later block may use a name an earlier one
defined. Fences in other languages (console, ini, yaml, toml, text) are text.

A MyST comment ``% skip: next`` on the line before a block leaves it out; so
does the HTML comment ``<!-- skip: next -->``, which GitHub hides when it
renders the README. ``skip: start`` and ``skip: end`` leave out the blocks
between them, and ``skip: next if(django.VERSION < (6, 0), reason="...")``
only sometimes: each namespace starts with ``django`` imported for such
conditions. Either way pytest reports the block as skipped. Setup a reader
need not see goes in an invisible block: ``<!-- invisible-code-block: python``,
the code, then ``-->`` (or MyST's ``% invisible-code-block: python`` with each
line of code after a ``%``).

What a document's blocks can count on (``document_sandbox`` in
``tests/documentation/test_docs_examples.py``): the test database (tests.settings), inside
one transaction rolled back after the document's last block; the example
project's jobs and models, and its ``library`` app importable as ``library``
too (``from library.models import Library``), as the README's quickstart
names it; a block's ``@job("scan")`` replaces the job of that name until the
document ends. The documents run in the SQLite cells only.

The trick: pytest collects only what is under ``tests/``, so a test module
holds a ``DocumentExamples`` and the ``pytest_pycollect_makeitem`` hook in
``tests/conftest.py`` turns it into one collector per document, Sybil's own.
Sybil treats a document as a module, so a module-scoped fixture lasts one
document.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Iterator, Sequence
from doctest import ELLIPSIS, NORMALIZE_WHITESPACE
from pathlib import Path
from typing import Any
from unittest import SkipTest

import django
import pytest
from _pytest._code.code import Traceback
from django.test import TestCase
from sybil import Document, Region, Sybil
from sybil.integration.pytest import SybilFile, SybilItem
from sybil.parsers.myst import DocTestDirectiveParser, PythonCodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parents[2]

# The README, and every page under docs/ but a build's output.
DOCUMENTS = ("README.md", "docs/**/*.md")
NOT_DOCUMENTS = ("_build", ".")


class ReportedSkipParser(SkipParser):
    """Sybil's MyST skip comments, whose blocks pytest reports as skipped rather than passed."""

    def __call__(self, document: Document) -> Iterator[Region]:
        for region in super().__call__(document):
            action, reason = region.parsed
            if action in ("start", "next") and reason is None:
                # Sybil evaluates a reason as Python and skips with its value.
                region.parsed = (action, repr(f"a `skip: {action}` comment"))
            yield region


def start_namespace(namespace: dict[str, Any]) -> None:
    namespace["django"] = django
    # For ``skip: next if(not installed("prometheus_client"), ...)``: an
    # extra's example where the core is installed alone.
    namespace["installed"] = lambda package: importlib.util.find_spec(package) is not None


def docs_sybil(fixtures: Sequence[str] = ()) -> Sybil:
    """The Sybil that finds the examples: Python blocks, ``>>>`` sessions and skip comments."""
    flags = ELLIPSIS | NORMALIZE_WHITESPACE
    return Sybil(
        parsers=[
            PythonCodeBlockParser(doctest_optionflags=flags),
            DocTestDirectiveParser(optionflags=flags),
            ReportedSkipParser(),
        ],
        setup=start_namespace,
        fixtures=fixtures,
    )


def document_paths(root: Path, patterns: Iterable[str]) -> list[Path]:
    """The documents under ``root`` matching ``patterns``, each once, in the order of the patterns."""
    found: dict[Path, None] = {}
    for pattern in patterns:
        for path in sorted(root.glob(pattern)):
            folders = path.relative_to(root).parts[:-1]
            if not any(folder.startswith(NOT_DOCUMENTS) for folder in folders):
                found[path] = None
    return list(found)


class DocumentTestCase(TestCase):
    """What a document's examples are to pytest-django: a TestCase on the default database.

    pytest-django creates the test database only if some item needs it, which
    it reads from the item's ``cls``, as for a Django TestCase's methods, or
    from a ``django_db`` mark; a mark would also wrap each block in a
    transaction of its own. Nothing runs this class: ``document_sandbox`` holds
    the document's transaction.
    """

    databases = {"default"}


class DocumentExample(SybilItem):
    """One block of a document, as Sybil runs it; its skips are reported at the block."""

    cls = DocumentTestCase

    def reportinfo(self) -> tuple[str, int, str]:
        # pytest counts an item's line from 0, Sybil from 1.
        path, line, info = super().reportinfo()
        return str(path), (line or 1) - 1, info

    def _traceback_filter(self, excinfo: pytest.ExceptionInfo[BaseException]) -> Traceback:
        # Sybil's filter starts the traceback at the block; this drops the
        # frames that pytest's own filter would (__tracebackhide__).
        return super()._traceback_filter(excinfo).filter(excinfo)

    def runtest(self) -> None:
        try:
            super().runtest()
        except SkipTest as skip:
            # Sybil skips with unittest's exception, which pytest would report
            # as raised in its unittest plugin rather than at the block.
            raise pytest.skip.Exception(str(skip), _use_item_location=True) from None


class DocumentFile(SybilFile):
    """A document as Sybil collects it, with one ``DocumentExample`` per block."""

    def collect(self) -> Iterator[pytest.Item]:
        for sybil in self.sybils:
            document = sybil.parse(self.path)
            self.documents.append(document)
            for example in document.examples():
                yield DocumentExample.from_parent(self, sybil=sybil, example=example)


class DocumentExamples:
    """Documents whose examples a test module collects as tests (see tests/conftest.py)."""

    def __init__(self, patterns: Iterable[str] = DOCUMENTS, root: Path = ROOT, sybil: Sybil | None = None):
        self.patterns = tuple(patterns)
        self.root = root
        self.sybil = sybil or docs_sybil()

    def collect(self, parent: pytest.Collector) -> list[pytest.Collector]:
        """One collector per document, under ``parent``; its items are the document's examples."""
        return [
            DocumentFile.from_parent(parent, path=path, sybils=[self.sybil])
            for path in document_paths(self.root, self.patterns)
        ]
