from __future__ import annotations

import threading
import time

from vellum_jobs.filechanges import FileChanges


def test_a_write_to_a_watched_file_ends_the_wait(tmp_path):
    changes = FileChanges.of(tmp_path, {"db.sqlite3-wal"})
    assert changes is not None  # Linux: inotify is there
    try:
        writer = threading.Timer(0.1, lambda: (tmp_path / "db.sqlite3-wal").write_bytes(b"frame"))
        writer.start()
        started = time.monotonic()
        assert changes.wait(5) is True
        assert time.monotonic() - started < 2
        writer.join()
    finally:
        changes.close()


def test_writes_to_other_files_and_silence_do_not_end_it(tmp_path):
    changes = FileChanges.of(tmp_path, {"db.sqlite3-wal"})
    assert changes is not None
    try:
        (tmp_path / "unrelated.log").write_text("noise")
        started = time.monotonic()
        assert changes.wait(0.3) is False
        assert time.monotonic() - started >= 0.3
    finally:
        changes.close()


def test_a_missing_directory_means_no_watcher(tmp_path):
    assert FileChanges.of(tmp_path / "missing", {"x"}) is None
