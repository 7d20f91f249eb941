"""The Celery app, configured from Settings; the API uses the same factory to send tasks."""

from __future__ import annotations

from celery import Celery

from app.core.settings import Settings


def make_celery(settings: Settings, *, register_tasks: bool = False) -> Celery:
    app = Celery("kaudit", broker=settings.celery_broker, set_as_current=False)
    transport: dict[str, object] = {"visibility_timeout": settings.visibility_timeout_s}
    if settings.celery_broker.startswith("filesystem"):
        for sub in ("in", "processed", "control"):
            (settings.broker_dir / sub).mkdir(parents=True, exist_ok=True)
        transport = {
            "data_folder_in": str(settings.broker_dir / "in"),
            "data_folder_out": str(settings.broker_dir / "in"),
            "processed_folder": str(settings.broker_dir / "processed"),
            "control_folder": str(settings.broker_dir / "control"),  # kombu's default is ./control, in the cwd
            "store_processed": False,
            "polling_interval": 0.05,
        }
    elif settings.celery_broker.startswith("redis"):
        transport.update(socket_timeout=5, socket_connect_timeout=2)
    app.conf.update(
        broker_transport_options=transport,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_soft_time_limit=settings.soft_time_limit_s,
        task_time_limit=settings.hard_time_limit_s,
        task_ignore_result=True,
        task_default_queue=settings.audit_queue,
        task_serializer="json",
        accept_content=["json"],
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        broker_pool_limit=20,
        # a new pool process reports up only after worker_process_init (torch, the engine, the catalogue): Celery's
        # 4 s default SIGKILLs it mid-import under load, again and again (Settings.worker_proc_alive_timeout_s)
        worker_proc_alive_timeout=settings.worker_proc_alive_timeout_s,
    )
    if register_tasks:
        from app.audits import reaper
        from app.audits import tasks as audit
        from app.webhooks import dispatch as webhooks

        audit.register(app, settings)
        reaper.register(app, settings)
        webhooks.register(app, settings)
    return app
