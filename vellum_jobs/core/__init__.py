"""The job and its rules: the models, the state machine every write renders from, one attempt's
bookkeeping, the options a job is enqueued with, its JSON payload, the registry of handlers by name
(``registry``), and the database's clock. Imports nothing of vellum-jobs but the leaves (``conf``,
``exceptions``, ``signals``)."""
