"""Other queues and the raw-SQL limit on vellum-jobs' workload: a module each, run in subprocesses."""
