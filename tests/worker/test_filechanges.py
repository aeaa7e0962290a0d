from __future__ import annotations

import sqlite3
import threading
import time

from vellum_jobs.worker import wakeup
from vellum_jobs.worker.file_changes import FileChanges


def test_a_write_to_a_watched_file_ends_the_wait(tmp_path):
    changes = FileChanges.of(tmp_path, {"db.sqlite3-wal"})
    assert changes is not None  # Linux: inotify is there
    try:
        writer = threading.Timer(0.1, lambda: (tmp_path / "db.sqlite3-wal").write_bytes(b"frame"))
        writer.start()
        started = time.monotonic()
        assert changes.wait(5) is True
        assert time.monotonic() - started < 4  # woken by the write, not the end of the wait
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


def test_after_a_write_the_watcher_waits_for_the_commit_to_show(tmp_path):
    # Woken by the WAL write, the watcher may look before the commit is
    # visible; it keeps looking for a moment instead of sleeping on.
    path = tmp_path / "db.sqlite3"
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("PRAGMA journal_mode = WAL")
    writer.execute("CREATE TABLE t (x)")
    check = sqlite3.connect(path).cursor()
    last = check.execute("PRAGMA data_version").fetchone()[0]
    commit = threading.Timer(0.02, lambda: writer.execute("INSERT INTO t VALUES (1)"))
    commit.start()
    try:
        assert wakeup._data_version(check, last, settle=5.0) != last
    finally:
        commit.join()
        writer.close()
