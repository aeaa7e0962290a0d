"""One attempt of a claimed job, wherever it runs (a slot thread, the event loop, inline): the
handler run into an outcome (``handler_run``), what an outcome is (``outcome``), the retry policy
(``retry_policy``), the batched fenced writes of outcomes (``outcome_writes``), the job signals
(``job_signals``), cancellation, the job context a handler reads, and the spans of attempts and
enqueues."""
