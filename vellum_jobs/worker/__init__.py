"""One ``runjobs`` process: its lifecycle (``process``), which wires its parts: the dispatcher that
claims and records outcomes (``dispatcher``), the runners (slot threads and the event loop), the
heartbeat that renews its own leases, delivers cancellations, records its row and schedules the
queue's duties, the watchdog of timeouts (``watchdog``), the schedules' timer, the stop signals, the
hand-back at shutdown, waking up on news of a job (LISTEN, the MariaDB probe, SQLite's file
changes), the watch on silent database calls; and the ``--processes`` supervisor."""
