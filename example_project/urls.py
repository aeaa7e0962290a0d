from __future__ import annotations

from django.contrib import admin
from django.urls import path

from example_project.library import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("libraries/add/", views.add_library, name="add-library"),
]
