"""Duties any process performs for the whole queue, whoever runs them: retention of finished
jobs, the schedules' ticks, and failing jobs whose name no live worker knows."""
