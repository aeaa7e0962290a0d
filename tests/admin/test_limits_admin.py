"""The Limits page and the dashboard's throttled keys, through Django's test client."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse
from django.utils import timezone

from tests.support.admin_pages import staff_user
from tests.support.limit_rows import ago, hold, holder, limits, queued, rate_starts, started

pytestmark = pytest.mark.django_db

LIMITS = reverse("admin:vellum_jobs_job_limits")
DASHBOARD = reverse("admin:vellum_jobs_job_dashboard")


def key_rows(html: str) -> dict[str, list[dict[str, str]]]:
    """The Limits table's rows by key: each row's cells by class, tags stripped."""
    found: dict[str, list[dict[str, str]]] = {}
    for key, row in re.findall(r'<tr data-key="([^"]+)"[^>]*>(.*?)</tr>', html, re.S):
        cells = re.findall(r'<td class="vellum-([\w-]+)[^"]*"[^>]*>(.*?)</td>', row, re.S)
        text = {name: " ".join(re.sub(r"<[^>]+>", "", value).split()) for name, value in cells}
        found.setdefault(key, []).append(text)
    return found


def test_each_key_in_use_with_its_limits_use_next_slot_hold_and_jobs_waiting(admin_client):
    now = timezone.now()
    queued(limits(rates=[("customer:42", 2, 60), ("customer:42", 100, 3600)]), 3)
    rate_starts("customer:42", 60, *ago(now, 5, 20))
    gpu = limits(concurrency=[("gpu", 2)])
    running = started(gpu, now)
    holder("gpu", 0, running)
    hold("api.example.com", now, 30, "429: retry in 30 s")

    response = admin_client.get(LIMITS)

    assert response.status_code == 200
    html = response.content.decode()
    rows = key_rows(html)
    # Throttled first (most waited on first), then the others.
    assert list(rows) == ["customer:42", "api.example.com", "gpu"]
    (held,) = rows["api.example.com"]
    assert held["kind"] == "hold only"
    assert held["hold"].endswith(": 429: retry in 30 s") and "ahead" in held["hold"]
    minute, hour = rows["customer:42"]
    assert (minute["kind"], minute["limit"], minute["use"]) == (
        "rate",
        "2 per minute",
        "2 of 2 per minute used full",
    )
    assert "ahead" in minute["next"] or "now" in minute["next"]
    assert minute["waiting"] == "3" and minute["key"].startswith("customer:42 throttled")
    assert (hour["limit"], hour["use"], hour["next"]) == ("100 per hour", "0 of 100 per hour used", "")
    (conc,) = rows["gpu"]
    assert (conc["kind"], conc["limit"], conc["use"]) == (
        "concurrency",
        "2 at once",
        f"1 of 2 running (#{running.pk})",
    )
    assert reverse("admin:vellum_jobs_job_change", args=[running.pk]) in html


def test_with_no_limit_in_use_it_says_so(admin_client):
    html = admin_client.get(LIMITS).content.decode()
    assert 'id="vellum-limits-empty"' in html and "No limit is in use" in html
    assert 'id="vellum-limits"' not in html


def test_past_the_read_bound_the_jobs_waiting_are_at_least(admin_client, monkeypatch):
    from vellum_jobs.observe import limits as view

    monkeypatch.setattr(view, "WAITING_READ", 2)
    queued(limits(concurrency=[("gpu", 1)]), 3)

    html = admin_client.get(LIMITS).content.decode()

    assert key_rows(html)["gpu"][0]["waiting"] == "at least 2"
    assert "at least these" in html


def test_it_needs_the_job_permissions_and_is_linked_from_the_job_list_and_the_app_index(admin_client, client):
    assert LIMITS in admin_client.get(reverse("admin:vellum_jobs_job_changelist")).content.decode()
    assert LIMITS in admin_client.get(reverse("admin:app_list", args=["vellum_jobs"])).content.decode()
    client.force_login(staff_user("view_worker"))
    assert client.get(LIMITS).status_code == 403
    client.force_login(staff_user("view_job"))
    assert client.get(LIMITS).status_code == 200


def test_the_dashboard_shows_a_held_key_and_a_full_one_with_jobs_waiting(admin_client):
    now = timezone.now()
    hold("api.example.com", now, 30, "429 from the API")
    queued(limits(rates=[("mail", 1, 60)]), 4)
    rate_starts("mail", 60, now)
    queued(limits(concurrency=[("roomy", 5)]))  # has room: not throttled

    html = admin_client.get(DASHBOARD).content.decode()

    table = re.search(r'<table[^>]* id="vellum-throttled"[^>]*>(.*?)</table>', html, re.S)
    assert table, html
    rows = dict(re.findall(r'<tr data-key="([^"]+)">(.*?)</tr>', table[1], re.S))
    assert set(rows) == {"api.example.com", "mail"}
    assert "held until " in rows["api.example.com"] and "429 from the API" in rows["api.example.com"]
    assert "full: rate 1 of 1 per minute used, next slot at " in rows["mail"]
    assert '<td class="vellum-waiting">4</td>' in rows["mail"]
    assert LIMITS in html


def test_the_dashboard_says_when_no_key_is_throttled_and_shows_nothing_without_limits(admin_client):
    assert "Throttled limit keys" not in admin_client.get(DASHBOARD).content.decode()
    queued(limits(concurrency=[("roomy", 5)]))
    html = admin_client.get(DASHBOARD).content.decode()
    assert "None: 1 limit key in use, none held or full with jobs waiting" in html


def test_past_its_bound_the_page_lists_the_first_keys_and_says_how_many_more(admin_client, monkeypatch):
    from vellum_jobs.admin import limits as page

    monkeypatch.setattr(page, "SHOWN", 2)
    for n, waiting in enumerate([1, 3, 2]):
        queued(limits(concurrency=[(f"customer:{n}", 5)]), waiting)

    html = admin_client.get(LIMITS).content.decode()

    assert list(key_rows(html)) == ["customer:1", "customer:2"]
    assert "1 more key in use not listed" in html
