"""The example project's jobs, run the way a worker runs them: scan, index each item, fetch artwork."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest

from example_project.library.jobs import scan_library
from example_project.library.models import Item, Library
from tests.support.drain import drain
from tests.support.processes import wait_for
from vellum_jobs.core.models import Job

pytestmark = pytest.mark.django_db(transaction=True)

SAMPLE_MEDIA = Path(__file__).resolve().parents[2] / "example_project" / "sample_media"


def run_until_settled(timeout: float = 30) -> None:
    """Run due jobs until none is queued: retries come due after their backoff."""

    def settled() -> bool:
        drain()
        return not Job.objects.filter(state__in=[Job.State.QUEUED, Job.State.RUNNING]).exists()

    wait_for(settled, timeout, what="every job to finish")


def test_a_scan_creates_items_that_their_own_jobs_index_and_reference():
    library = Library.objects.create(name="Sample media", path=str(SAMPLE_MEDIA))
    scan = scan_library.using(ref=library).enqueue(library.pk)
    files = sorted(p.relative_to(SAMPLE_MEDIA).as_posix() for p in SAMPLE_MEDIA.rglob("*") if p.is_file())

    run_until_settled()

    scan.refresh_from_db()
    assert scan.state == Job.State.DONE
    assert scan.result["files"] == scan.result["new_items"] == len(files)
    assert (scan.progress_done, scan.progress_total) == (len(files), len(files))
    assert sorted(Item.objects.values_list("path", flat=True)) == files

    for item in Item.objects.all():
        index = Job.objects.for_object(item).get(name="index_item")
        assert index.state == Job.State.DONE
        assert item.checksum and item.indexed_at is not None
    cover = Item.objects.get(path="photos/2024 Coast/pier.png")
    assert cover.details == {"width": 48, "height": 32}

    # The pretend cover-art service: one track in ten never answers,
    # three in ten only on the second try.
    outcomes = set()
    for item in Item.objects.filter(kind=Item.Kind.AUDIO):
        artwork = Job.objects.for_object(item).get(name="fetch_artwork")
        luck = zlib.crc32(item.path.encode()) % 10
        expected = (Job.State.FAILED, 3) if luck == 0 else (Job.State.DONE, 2 if luck <= 3 else 1)
        assert (artwork.state, artwork.attempts) == expected, item.path
        outcomes.add(expected)
    # The sample media shows every outcome in the demo.
    assert outcomes == {(Job.State.FAILED, 3), (Job.State.DONE, 2), (Job.State.DONE, 1)}


def test_a_second_scan_finds_nothing_new():
    library = Library.objects.create(name="Books", path=str(SAMPLE_MEDIA / "books"))
    scan_library.enqueue(library.pk)
    drain()
    second = scan_library.enqueue(library.pk)
    drain()
    second.refresh_from_db()
    assert second.result["new_items"] == 0
    assert Job.objects.filter(name="index_item").count() == 2


def test_a_scan_of_a_missing_folder_fails_with_the_reason():
    library = Library.objects.create(name="Unplugged disk", path="/mnt/unplugged-disk")
    job = scan_library.enqueue(library.pk)
    Job.objects.filter(pk=job.pk).update(max_attempts=1)
    drain()
    job.refresh_from_db()
    assert job.state == Job.State.FAILED
    assert "FileNotFoundError: /mnt/unplugged-disk is not a folder" in job.error
