"""Celery side of the service: the app factory, the audit task, leases and the reaper.

Importing this package never imports torch: CUDA must not be initialised in the Celery parent."""
