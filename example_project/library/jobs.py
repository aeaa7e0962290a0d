"""The example's job: scan a library folder and report what it holds."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from example_project.library.models import Library
from vellum_jobs import Fail, job, set_progress


@job("scan", queue="media", max_attempts=3)
def scan_library(library_id: int) -> dict[str, object]:
    """Count the files of a library by extension, with their total size."""
    try:
        library = Library.objects.get(pk=library_id)
    except Library.DoesNotExist:
        raise Fail(f"library {library_id} was deleted") from None
    root = Path(library.path)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a folder")
    folders = [root, *(p for p in root.iterdir() if p.is_dir())]
    extensions: Counter[str] = Counter()
    files = size = 0
    for done, folder in enumerate(folders, start=1):
        walk = os.walk(folder) if folder != root else [(str(root), [], os.listdir(root))]
        for dirpath, _, filenames in walk:
            for filename in filenames:
                path = Path(dirpath, filename)
                if path.is_file():
                    files += 1
                    size += path.stat().st_size
                    extensions[path.suffix or "(none)"] += 1
        set_progress(done, len(folders), f"scanned {folder.name}")
    return {"files": files, "bytes": size, "top_extensions": dict(extensions.most_common(3))}
