"""The limits' metrics: each key's use, jobs waiting and hold, at most ``LIMIT_KEYS_SHOWN`` keys by
name and the rest as "(other)" (needs the ``prometheus`` extra)."""

from __future__ import annotations

import pytest
from django.test import override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from tests.support.limit_rows import ago, hold, holder, limits, queued, rate_starts, started
from tests.testapp import jobs  # noqa: F401 (registers test.add, the name of the rows' jobs)
from vellum_jobs.observe import limit_metrics

pytestmark = pytest.mark.django_db


def scrape(client) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Each metric's samples by their labels."""
    with override_settings(VELLUM_JOBS={"LEASE": 60, "HEARTBEAT": 10}):
        response = client.get("/jobs/metrics/")
    assert response.status_code == 200, response.content
    return {
        family.name: {tuple(sorted(s.labels.items())): s.value for s in family.samples}
        for family in text_string_to_metric_families(response.content.decode())
    }


def test_the_metrics_give_each_key_s_use_jobs_waiting_and_hold(staff):
    now = timezone.now()
    queued(limits(rates=[("mail", 10, 60)], concurrency=[("gpu", 2)]), 3)
    rate_starts("mail", 60, *ago(now, 1, 2, 3))
    running = started(limits(concurrency=[("gpu", 2)]), now)
    holder("gpu", 0, running)
    hold("api.example.com", now, 30)

    found = scrape(staff)

    assert found["vellum_jobs_limit_keys"] == {(): 3}
    assert found["vellum_jobs_limit_in_use"] == {
        (("key", "mail"), ("kind", "rate")): 3,
        (("key", "gpu"), ("kind", "concurrency")): 1,
    }
    assert found["vellum_jobs_limit_waiting"] == {
        (("key", "mail"), ("kind", "rate")): 3,
        (("key", "gpu"), ("kind", "concurrency")): 3,
    }
    assert found["vellum_jobs_limit_held"] == {
        (("key", "api.example.com"),): 1,
        (("key", "mail"),): 0,
        (("key", "gpu"),): 0,
    }


def test_the_metrics_label_the_most_waited_on_keys_and_add_up_the_rest_as_other(staff, monkeypatch):
    now = timezone.now()
    monkeypatch.setattr(limit_metrics, "LIMIT_KEYS_SHOWN", 2)
    for n, waiting in enumerate([5, 1, 4, 2]):
        queued(limits(concurrency=[(f"customer:{n}", 1)]), waiting)
    hold("customer:1", now, 30)

    found = scrape(staff)

    waiting = {dict(labels)["key"]: value for labels, value in found["vellum_jobs_limit_waiting"].items()}
    assert waiting == {"customer:0": 5, "customer:2": 4, "(other)": 3}
    assert {dict(labels)["key"]: v for labels, v in found["vellum_jobs_limit_held"].items()} == {
        "customer:0": 0,
        "customer:2": 0,
        "(other)": 1,
    }
    assert found["vellum_jobs_limit_keys"] == {(): 4}
