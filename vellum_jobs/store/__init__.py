"""Every statement on the queue's tables: the claim, the fenced write, the INSERT of new jobs,
lease renewal and recovery, maintenance locks, the rollup's writes, riding out database trouble,
and each vendor's raw SQL (``sql/``). Imports only ``core`` and the leaves."""
