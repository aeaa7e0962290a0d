"""Turning calls into rows: ``@job`` and the ``JobFunction`` it puts in the registry
(``job_function``; the registry itself is ``core.registry``), checking and inserting the jobs of an
enqueue, and unique keys. An enqueue in inline mode runs its job at once through ``execution``."""
