"""The app's URLs, to include under any prefix: ``path("jobs/", include("vellum_jobs.urls"))``."""

from __future__ import annotations

from django.urls import path

from vellum_jobs import views

app_name = "vellum_jobs"

urlpatterns = [
    path("health/", views.health, name="health"),
    path("metrics/", views.prometheus_metrics, name="metrics"),
]
