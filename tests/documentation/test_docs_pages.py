"""The pages a new reader and an operator land on: what they must show, and where they are listed."""

from __future__ import annotations

import re

from tests.support.docs_examples import ROOT

DOCS = ROOT / "docs"
IMAGE = re.compile(r"!\[[^\]]+\]\((?P<path>[^)\s]+)\)")


def toctree(page: str) -> list[str]:
    found = re.search(r"```\{toctree\}\n(?P<body>.*?)```", (DOCS / page).read_text(), re.DOTALL)
    assert found, f"{page} has no toctree"
    return [line.strip() for line in found["body"].splitlines() if line.strip() and not line.startswith(":")]


def test_the_index_page_shows_the_install_line_a_code_sample_and_a_picture():
    index = (DOCS / "index.md").read_text()
    assert "$ pip install vellum-jobs\n" in index
    assert "```python\n" in index and "@job(" in index and ".enqueue(" in index
    pictures = IMAGE.findall(index)
    assert pictures, "docs/index.md shows no picture"
    assert all((DOCS / path).is_file() for path in pictures), pictures


def test_the_checklist_and_troubleshooting_are_how_to_guides_listed_in_their_index():
    listed = toctree("howto/index.md")
    index = (DOCS / "howto" / "index.md").read_text()
    for page in ("production-checklist", "troubleshooting"):
        assert page in listed
        assert f"({page}.md)" in index
        assert (DOCS / "howto" / f"{page}.md").is_file()
