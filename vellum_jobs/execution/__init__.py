"""One attempt of a claimed job, wherever it runs (a slot thread, the event loop, inline): the
handler run into an outcome, the retry policy, the batched fenced writes of outcomes,
cancellation, the job context a handler reads, and the spans of attempts and enqueues."""
