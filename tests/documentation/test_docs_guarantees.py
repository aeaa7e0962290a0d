"""Every promise and every fault in the guarantees page names a test that exists and proves it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "explanation" / "guarantees.md"
NAMED = re.compile(
    r"`(?:tests/(?P<module>[\w/]+\.py)(?:::(?:\w+::)?(?P<first>test_\w+))?|(?P<bare>test_\w+))`"
)


def sections() -> tuple[list[str], list[str]]:
    """The promises (bullets) and the rows of the fault table, as text."""
    text = PAGE.read_text()
    promises = text.split("## The promises", 1)[1].split("\n## ", 1)[0]
    faults = text.split("## What happens to a job in each fault", 1)[1].split("\n## ", 1)[0]
    bullets = [b for b in re.split(r"\n- ", "\n" + promises.split("\n\n", 2)[1]) if b.strip()]
    rows = [line for line in faults.splitlines() if line.startswith("| ") and not line.startswith("| fault")]
    return bullets, rows


def named_tests(text: str) -> list[tuple[str, str]]:
    """(module, test) pairs a text names; a bare test name belongs to the module named before it."""
    found, module = [], ""
    for match in NAMED.finditer(text):
        module = match["module"] or module
        test = match["first"] or match["bare"] or ""
        found.append((module, test))
    return found


def defined(module: str, test: str) -> bool:
    path = ROOT / "tests" / module
    if not path.exists():
        return False
    return not test or re.search(rf"^\s*(async )?def {test}\(", path.read_text(), re.MULTILINE) is not None


def test_every_promise_and_every_fault_names_a_test_that_exists():
    bullets, rows = sections()
    assert len(bullets) >= 6 and len(rows) >= 20
    for text in [*bullets, *rows]:
        tests = named_tests(text)
        assert tests, f"names no test: {text[:100]}"
        for module, test in tests:
            assert module, f"{test} is named before any module: {text[:100]}"
            assert defined(module, test), f"tests/{module}::{test} does not exist ({text[:60]})"
