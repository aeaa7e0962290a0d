"""Turning calls into rows: ``@job`` and the registry, checking and inserting the jobs of an
enqueue, and unique keys. An enqueue in inline mode runs its job at once through ``execution``."""
