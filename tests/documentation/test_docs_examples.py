"""The README's and the docs pages' Python examples run as tests (see tests/support/docs_examples.py)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction

from tests.support.docs_examples import ROOT, DocumentExamples, docs_sybil
from vellum_jobs.core import registry
from vellum_jobs.core.registry import Handler

# Collected by tests/conftest.py: one test per Python block, README.md::line:73,column:1.
documents = DocumentExamples(sybil=docs_sybil(fixtures=["document_sandbox"]))

# The app the README's and the tutorial's examples are about (`from
# library.models import Library`) is the example project's, whose label is
# `library` too: the tutorial writes the example's files into a new project.
LIBRARY_MODULES = {
    name: f"example_project.{name}" for name in ("library", "library.models", "library.jobs", "library.views")
}
# The tutorial copies the example's sample media next to manage.py, and its
# examples open them as `Path("sample_media")`.
PROJECT_FOLDER = ROOT / "example_project"


@pytest.fixture(scope="module")
def document_sandbox(request: pytest.FixtureRequest) -> Iterator[None]:
    """One document's run: the database in a transaction rolled back after its last block, and its jobs."""
    if connection.vendor != "sqlite":
        pytest.skip("the docs' examples are vendor-neutral; they run in the SQLite cells")
    request.getfixturevalue("django_db_setup")
    blocker = request.getfixturevalue("django_db_blocker")
    saved = registry.registered()
    add = registry.add

    def take_over(handler: Handler[Any, Any]) -> None:
        # A document's @job is the job of its name, as in a project of its
        # own, even where the example project or the test app has one ("scan").
        registry.remove(handler.name)
        add(handler)

    try:
        with pytest.MonkeyPatch.context() as patch, blocker.unblock(), transaction.atomic():
            patch.setattr(registry, "add", take_over)
            patch.chdir(PROJECT_FOLDER)
            for alias, name in LIBRARY_MODULES.items():
                patch.setitem(sys.modules, alias, importlib.import_module(name))
            yield
            transaction.set_rollback(True)
    finally:
        for name in registry.names():
            registry.remove(name)
        for handler in saved:
            registry.add(handler)


BROKEN_PAGE = """\
# A page

```python
answer = 42
```

% skip: next
```python
raise RuntimeError("skipped by the MyST comment")
```

<!-- skip: next -->
```python
raise RuntimeError("skipped by the HTML comment")
```

<!-- skip: next if(django.VERSION < (1, 0), reason="not on this Django") -->
```python
ran = True
```

<!-- invisible-code-block: python
hidden = answer + 1
-->

```console
$ python -c 'raise SystemExit(1)'
```

```python
assert ran and hidden == 43   # names from the blocks before
total = answer + undefined
```
"""


def line_of(text: str, needle: str) -> int:
    return text[: text.index(needle)].count("\n") + 1


def test_a_broken_example_fails_naming_its_file_and_line(tmp_path: Path):
    """The collection the README goes through, on a page of its own, in a pytest without Django."""
    (tmp_path / "page.md").write_text(BROKEN_PAGE)
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_pycollect_makeitem\n")
    (tmp_path / "test_page.py").write_text(
        "from pathlib import Path\n\nfrom tests.support.docs_examples import DocumentExamples\n\n"
        'documents = DocumentExamples(["*.md"], root=Path(__file__).parent)\n'
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:django", "-p", "no:cacheprovider", "-rfs", "test_page.py"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = run.stdout
    assert run.returncode == 1, out + run.stderr
    block = line_of(BROKEN_PAGE, "```python\nassert ran")
    failing = line_of(BROKEN_PAGE, "total = answer + undefined")
    assert f"FAILED page.md::line:{block},column:1 - NameError: name 'undefined' is not defined" in out, out
    assert f"page.md:{failing}: NameError" in out, out
    for comment in ("% skip: next", "<!-- skip: next -->"):
        skipped = line_of(BROKEN_PAGE, comment) + 1
        assert f"SKIPPED [1] page.md:{skipped}: a `skip: next` comment" in out, out
    # Passed: the first block, the one whose skip condition is false, the
    # invisible one, and the three skip comments; the console block is text.
    assert "1 failed, 6 passed, 2 skipped" in out, out
