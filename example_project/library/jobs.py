"""The example's jobs: scan a library's folder, index each file found, fetch artwork that sometimes fails.

``scan`` walks the folder, creates an ``Item`` per new file with progress
as it goes, and enqueues the per-item jobs in the same transaction as the
item, so an item never exists without its jobs. ``index_item`` hashes the
file and reads what it cheaply can. ``fetch_artwork``, an ``async def``,
stands in for a call to a flaky remote service: some items fail once and
succeed on the retry, a few never do and end ``failed``.

``LIBRARY_PACE`` (seconds per file, 0 unless set) slows the jobs down so
that progress can be watched on the example's handful of files.
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
import time
import zlib
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from vellum_jobs import Fail, current_job, job, set_progress

from .models import Item, Library

KINDS = {
    ".flac": Item.Kind.AUDIO,
    ".mp3": Item.Kind.AUDIO,
    ".ogg": Item.Kind.AUDIO,
    ".png": Item.Kind.IMAGE,
    ".jpg": Item.Kind.IMAGE,
    ".txt": Item.Kind.TEXT,
    ".md": Item.Kind.TEXT,
}


def pace() -> None:
    time.sleep(float(getattr(settings, "LIBRARY_PACE", 0)))


@job("scan", queue="media", max_attempts=3)
def scan_library(library_id: int) -> dict[str, Any]:
    """Create an Item for every new file under the library's folder, and queue its work."""
    library = Library.objects.filter(pk=library_id).first()
    if library is None:
        raise Fail(f"library {library_id} was deleted")
    root = Path(library.path)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a folder (is the disk mounted?)")
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))
    found = size = 0
    for done, path in enumerate(files, start=1):
        relative = path.relative_to(root).as_posix()
        size += path.stat().st_size
        if _add_item(library, relative, path):
            found += 1
        set_progress(done, len(files), f"found {relative}")
        pace()
    Library.objects.filter(pk=library.pk).update(scanned_at=timezone.now())
    return {"files": len(files), "new_items": found, "bytes": size}


def _add_item(library: Library, relative: str, path: Path) -> bool:
    """Create the item for a file seen for the first time, with its jobs; False if it was known."""
    kind = KINDS.get(path.suffix.lower(), Item.Kind.OTHER)
    with transaction.atomic():
        item, created = Item.objects.get_or_create(
            library=library, path=relative, defaults={"kind": kind, "size": path.stat().st_size}
        )
        if created:
            index_item.using(ref=item).enqueue(item.pk)
            if kind == Item.Kind.AUDIO:
                fetch_artwork.using(ref=item).enqueue(item.pk)
    return created


@job("index_item", queue="media")
def index_item(item_id: int) -> dict[str, Any]:
    """Hash an item's file and note what it holds: lines and words of text, pixels of a PNG."""
    item = Item.objects.select_related("library").filter(pk=item_id).first()
    if item is None:
        raise Fail(f"item {item_id} was deleted")
    data = (Path(item.library.path) / item.path).read_bytes()
    details: dict[str, Any] = {}
    if item.kind == Item.Kind.TEXT:
        text = data.decode("utf-8", errors="replace")
        details = {"lines": len(text.splitlines()), "words": len(text.split())}
    elif data[:8] == b"\x89PNG\r\n\x1a\n":
        width, height = struct.unpack(">II", data[16:24])
        details = {"width": width, "height": height}
    checksum = hashlib.sha256(data).hexdigest()
    pace()
    Item.objects.filter(pk=item.pk).update(
        checksum=checksum, size=len(data), details=details, indexed_at=timezone.now()
    )
    return {"sha256": checksum[:16], **details}


@job("fetch_artwork", queue="default", max_attempts=3, backoff=1, timeout=30)
async def fetch_artwork(item_id: int) -> str:
    """Ask the (pretend) cover-art service for an album cover; it times out now and then.

    A coroutine job: it would spend its time waiting on the service, so each
    worker's event loop runs many of them at once, with the async ORM.
    """
    item = await Item.objects.filter(pk=item_id).afirst()
    if item is None:
        raise Fail(f"item {item_id} was deleted")
    running = current_job()
    attempt = running.attempts if running else 1
    # Decided by the path, so every run of the demo tells the same story:
    # one track in ten always times out, three in ten only on the first try.
    luck = zlib.crc32(item.path.encode()) % 10
    await asyncio.sleep(float(getattr(settings, "LIBRARY_PACE", 0)))  # the service's reply
    if luck == 0 or (luck <= 3 and attempt == 1):
        raise TimeoutError(f"cover art service did not answer for {item.path!r} (attempt {attempt})")
    album = str(Path(item.path).parent)
    artwork = f"covers/{zlib.crc32(album.encode()):08x}.jpg"
    await Item.objects.filter(pk=item.pk).aupdate(artwork=artwork)
    return artwork
