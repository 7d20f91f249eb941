"""All configuration, from the environment (KAUDIT_ prefix, plus DATABASE_URL and REDIS_URL)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from worker.budget import AuditBudget


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KAUDIT_", extra="ignore")

    database_url: str = Field(
        default="sqlite:///.kaudit/kaudit.db",
        validation_alias=AliasChoices("DATABASE_URL", "KAUDIT_DATABASE_URL"),
        description="postgresql://... in production (psycopg 3), sqlite:///path on the embedded default",
    )
    redis_url: str | None = Field(default=None, validation_alias=AliasChoices("REDIS_URL", "KAUDIT_REDIS_URL"))
    broker_url: str | None = Field(
        default=None, description="overrides REDIS_URL as the Celery broker (filesystem:// embedded)"
    )
    broker_dir: Path = Path(".kaudit/broker")
    db_pool_size: int = 10
    db_connect_timeout_s: int = Field(
        default=5, ge=2, description="Postgres connection attempt limit (libpq's minimum is 2)"
    )

    # queues: one worker per GPU listens on gpu, CPU-profile audits go to cpu
    device: str = Field(
        default="cpu", description="this worker's device; also the API's default for solutions that name no hardware"
    )
    audit_devices: str | None = Field(
        default=None,
        description="comma-separated devices this deployment has workers for, e.g. 'cpu,cuda' (default: device)",
    )
    queue_prefix: str = ""
    audit_stages: str | None = Field(default=None, description="comma-separated stages to run (default: all)")
    extra_stages: str | None = Field(
        default=None,
        description="comma-separated modules of stages beyond worker/stages, each with run(ctx) and named "
        "by its last dotted part; they run after the built-in ones (worker.registry). The API, "
        "the workers and the CLI register them at start",
    )
    catalogue_root: Path | None = None
    isolation: Literal["namespaces", "none"] = Field(
        default="namespaces",
        description="namespaces: every submission runs under bubblewrap, and a worker that cannot isolate refuses to "
        "start; none: the operator's explicit opt-out (reports and the dashboard say so)",
    )
    sandbox_spare: bool = Field(
        default=False,
        description="each worker process keeps one sandbox child started ahead of its next audit "
        "(bubblewrap, Python, torch and the GPU's context: seconds per audit); each child "
        "still serves one audit only",
    )
    uploads_dir: Path = Field(default=Path(".kaudit/uploads"), description="where workers write uploaded definitions")
    accept_uploaded_definitions: bool = Field(
        default=True, description="false pins the curated catalogue: POST /v1/definitions answers 403"
    )

    # leases and the reaper
    lease_s: float = 120.0
    heartbeat_s: float = 15.0
    requeue_after_s: float = 120.0
    reaper_interval_s: float = 30.0
    max_claims: int = 3
    soft_time_limit_s: int = 3600
    hard_time_limit_s: int = 3900
    worker_proc_alive_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="how long Celery waits for a new pool process to report up before killing it. A pool process "
        "imports torch and the engine and loads the catalogue first: 2.9 s cold on an idle 2-core host, "
        "10 s with four starting at once, 13-18 s seen under load; Celery's own 4 s default killed "
        "replacement after replacement",
    )
    # one budget per audit, per device: a kernel call past the call timeout is a hang (the audit ends timed_out)
    cpu_audit_budget_s: float = 900.0
    cpu_call_timeout_s: float = 120.0
    gpu_audit_budget_s: float = 300.0
    gpu_call_timeout_s: float = 60.0

    # API
    body_limit_bytes: int = 1024 * 1024
    token_stats_max_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=1,
        description="largest token statistics file (decoded) a submission may carry; POST /v1/submissions accepts a "
        "body this much larger (base64 in JSON, or a multipart file) than body_limit_bytes",
    )
    rate_limit: str = "120/minute"
    rate_limit_storage_url: str | None = Field(
        default=None, description="memory:// or redis://; default: REDIS_URL, else memory"
    )
    key_cache_s: float = Field(default=10.0, description="a revoked API key stops working within this many seconds")
    public_read: bool = Field(
        default=True,
        description="true: /v1/problems, /v1/problems/{name} and /v1/leaderboard/{problem} "
        "answer without an API key; false: they need one (401 without)",
    )
    dashboard_public: bool = Field(
        default=True,
        description="false: the dashboard at / needs an API key (the locked page's form"
        " sets an HttpOnly cookie); a submission's private details need its owner's or an admin's key"
        " either way",
    )

    # webhooks (app/webhooks): an outbox delivered by a Celery task on the '<prefix>webhooks' queue
    webhook_timeout_s: float = Field(default=5.0, gt=0, description="one delivery attempt's connect + read budget")
    webhook_max_attempts: int = Field(
        default=8, ge=1, description="a delivery is marked failed after this many attempts"
    )
    webhook_backoff_base_s: float = Field(
        default=10.0, gt=0, description="first retry delay; doubles per attempt, with jitter"
    )
    webhook_backoff_max_s: float = Field(default=3600.0, gt=0, description="longest delay between two attempts")
    webhook_disable_after: int = Field(
        default=10, ge=1, description="an endpoint is disabled after this many consecutive failures"
    )
    webhook_sweep_interval_s: float = Field(default=1.0, gt=0, description="how often each worker sends due deliveries")
    webhook_allowlist: str = Field(
        default="",
        description="comma-separated CIDRs or host names that webhooks may reach although private/loopback/reserved",
    )

    @field_validator("webhook_allowlist")
    @classmethod
    def _allowlist_parses(cls, v: str) -> str:
        from app.webhooks.ssrf import AddressPolicy

        AddressPolicy.parse(v)  # a typo fails at start, not at the first webhook
        return v

    @field_validator("extra_stages")
    @classmethod
    def _stages_parse(cls, v: str | None) -> str | None:
        from worker.registry import StageRegistryError, parse_extra_stages

        try:
            parse_extra_stages(v)  # a typo fails at start, naming the variable, not in the first audit
        except StageRegistryError as err:
            raise ValueError(f"KAUDIT_EXTRA_STAGES: {err}") from err
        return v

    @model_validator(mode="after")
    def _soft_limit_below_hard(self) -> "Settings":
        # Celery's prefork pool arms the hard limit only when the soft one fires: with soft >= hard
        # the hard limit is never enforced (measured with Celery 5.7.0: a 15 s task ran to the end
        # under time_limit=3, soft_time_limit=100, and was SIGKILLed at 3 s without the soft limit)
        if self.soft_time_limit_s >= self.hard_time_limit_s:
            raise ValueError(
                f"KAUDIT_SOFT_TIME_LIMIT_S ({self.soft_time_limit_s}) must be below KAUDIT_HARD_TIME_LIMIT_S "
                f"({self.hard_time_limit_s}): Celery enforces the hard limit only after the soft one"
            )
        return self

    def audit_budget(self, device: str) -> AuditBudget:
        if device.startswith("cuda"):
            return AuditBudget(total_s=self.gpu_audit_budget_s, call_timeout_s=self.gpu_call_timeout_s)
        return AuditBudget(total_s=self.cpu_audit_budget_s, call_timeout_s=self.cpu_call_timeout_s)

    @property
    def submission_body_limit_bytes(self) -> int:
        """POST /v1/submissions: the solution's own limit, plus room for token statistics in base64 (4 per 3 bytes)."""
        return self.body_limit_bytes + 4 * -(-self.token_stats_max_bytes // 3) + 64 * 1024

    @property
    def sqlalchemy_url(self) -> str:
        url = self.database_url
        for prefix in ("postgres://", "postgresql://"):
            if url.startswith(prefix):
                return "postgresql+psycopg://" + url[len(prefix) :]
        return url

    @property
    def is_sqlite(self) -> bool:
        return self.sqlalchemy_url.startswith("sqlite")

    @property
    def celery_broker(self) -> str:
        if self.broker_url:
            return self.broker_url
        if self.redis_url:
            return self.redis_url
        return "filesystem://"

    @property
    def limits_storage(self) -> str:
        if self.rate_limit_storage_url:
            return self.rate_limit_storage_url
        return self.redis_url or "memory://"

    @property
    def audit_queue(self) -> str:
        return self.queue_for(self.device)

    def queue_for(self, device: str) -> str:
        return self.queue_prefix + ("gpu" if device.startswith("cuda") else "cpu")

    @property
    def webhook_queue(self) -> str:
        return self.queue_prefix + "webhooks"

    @property
    def devices(self) -> list[str]:
        """Devices audits can be routed to: audit_devices, else this process's own device."""
        named = [d.strip() for d in (self.audit_devices or "").split(",") if d.strip()]
        return list(dict.fromkeys(named)) if named else [self.device]

    @property
    def visibility_timeout_s(self) -> int:
        """Above the hard limit, so Redis never re-delivers a task that is still allowed to run."""
        return self.hard_time_limit_s + 600
