"""Named maintenance locks: taking, renewing, releasing, and losing them to time."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone

from vellum_jobs.core.models import MaintenanceLock
from vellum_jobs.store import locks

ALIAS = "default"
SECOND = timedelta(seconds=1)


@pytest.mark.django_db
def test_the_first_taker_creates_the_lock_and_others_are_refused_until_it_lapses():
    now = timezone.now()
    assert locks.acquire(ALIAS, "task", "a", now, now + 10 * SECOND) is True
    assert locks.acquire(ALIAS, "task", "b", now + 9 * SECOND, now + 20 * SECOND) is False
    assert locks.acquire(ALIAS, "task", "a", now + 9 * SECOND, now + 20 * SECOND) is False  # no re-entry
    assert locks.acquire(ALIAS, "task", "b", now + 10 * SECOND, now + 20 * SECOND) is True
    lock = MaintenanceLock.objects.get(name="task")
    assert (lock.holder, lock.locked_until) == ("b", now + 20 * SECOND)


@pytest.mark.django_db
def test_locks_of_different_names_are_independent():
    now = timezone.now()
    assert locks.acquire(ALIAS, "one", "a", now, now + SECOND)
    assert locks.acquire(ALIAS, "two", "b", now, now + SECOND)


@pytest.mark.django_db
def test_only_the_holder_renews_and_only_before_it_lapses():
    now = timezone.now()
    locks.acquire(ALIAS, "task", "a", now, now + 10 * SECOND)
    assert locks.renew(ALIAS, "task", "b", now, now + 30 * SECOND) is False
    assert locks.renew(ALIAS, "task", "a", now + 5 * SECOND, now + 30 * SECOND) is True
    assert locks.free_at(ALIAS, "task") == now + 30 * SECOND
    assert locks.renew(ALIAS, "task", "a", now + 30 * SECOND, now + 40 * SECOND) is False


@pytest.mark.django_db
def test_release_sets_when_it_is_free_again_and_only_the_holder_may():
    now = timezone.now()
    locks.acquire(ALIAS, "task", "a", now, now + 10 * SECOND)
    assert locks.release(ALIAS, "task", "b", until=now) is False
    assert locks.release(ALIAS, "task", "a", until=now + 60 * SECOND) is True
    assert locks.acquire(ALIAS, "task", "b", now + 59 * SECOND, now + 70 * SECOND) is False
    assert locks.acquire(ALIAS, "task", "b", now + 60 * SECOND, now + 70 * SECOND) is True


@pytest.mark.django_db
def test_free_at_is_none_for_a_lock_never_taken():
    assert locks.free_at(ALIAS, "never") is None


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("existing", [False, True], ids=["first-insert", "lapsed-row"])
def test_of_many_threads_racing_for_a_free_lock_exactly_one_gets_it(existing):
    now = timezone.now()
    if existing:
        MaintenanceLock.objects.create(name="task", holder="gone", locked_until=now - SECOND)
    barrier = threading.Barrier(8)
    won = []

    def race(holder: str) -> None:
        try:
            barrier.wait()
            if locks.acquire(ALIAS, "task", holder, now, now + 60 * SECOND):
                won.append(holder)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=race, args=(f"t{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1
    assert MaintenanceLock.objects.get(name="task").holder == won[0]
