"""One ``runjobs`` process: its lifecycle, the dispatcher that claims, the runners (slot threads
and the event loop), the heartbeat, timeouts, waking up on news of a job (LISTEN, the MariaDB
probe, SQLite's file changes), the watch on silent database calls, and the ``--processes``
supervisor."""
