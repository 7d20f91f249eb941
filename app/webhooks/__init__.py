"""Signed webhook notifications (Standard Webhooks, via the `standardwebhooks` package).

event_types: the events and their payloads · notify: the events of each audit state change (called by
app.audits.events in the change's transaction) · outbox: the rows, one per (event, endpoint) · dispatch: the sweep
and the Celery task on `<prefix>webhooks` · delivery: one attempt, its log, backoff and disabling · sender: the
signed POST to the checked address · ssrf: which addresses may be reached · endpoints, schemas, router: the API."""
