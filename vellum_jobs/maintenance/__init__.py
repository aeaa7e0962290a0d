"""Duties any process performs for the whole queue, whoever runs them (``duties``, which a worker's
heartbeat performs at each beat): recovering the jobs of any worker whose lease lapsed, the outcome
figures, retention of finished jobs, failing jobs whose name no live worker knows; and the
schedules' ticks."""
