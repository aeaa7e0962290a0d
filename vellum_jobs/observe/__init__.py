"""The read side: counts and figures (``jobstats``, the health view), the Prometheus metrics,
the health conditions, and ``explain()``: why a queued job has not started."""
