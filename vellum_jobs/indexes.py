"""The partial indexes, where migrations 0001-0010 import them; they live in
``vellum_jobs.core.indexes``."""

from vellum_jobs.core.indexes import PartialIndex, PartialUniqueConstraint

__all__ = ["PartialIndex", "PartialUniqueConstraint"]
