"""Finished spans in a file, one JSON object a line: how a ``runjobs`` process of the tracing tests
reports its spans to the test that started it.

The test app installs it when ``VELLUM_TEST_SPANS`` names the file. Each
span is written as it ends (``SimpleSpanProcessor``), as the SDK's
``ReadableSpan.to_json`` renders it, so a test can wait for it there.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


class SpanFile(SpanExporter):
    """Appends each finished span to ``path`` as one line of JSON."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # Slot threads and the event loop's thread end spans at once; each line is written whole.
        self.lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(span.to_json(indent=None) + "\n" for span in spans)
        with self.lock, self.path.open("a") as out:
            out.write(lines)
        return SpanExportResult.SUCCESS


def install(path: str) -> None:
    """Make this process's tracer provider an SDK one that writes its spans to ``path``."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(SpanFile(Path(path))))
    trace.set_tracer_provider(provider)


def read(path: Path) -> list[dict[str, Any]]:
    """The spans written to ``path`` so far; a line still being written is left for the next read."""
    if not path.exists():
        return []
    *complete, _unfinished = path.read_text().split("\n")
    return [json.loads(line) for line in complete]
