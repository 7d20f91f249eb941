from app.audits.status import FINISHED
from app.models.base import Base, new_id
from app.models.tables import (
    AUDIT_STATUSES,
    ApiKey,
    Audit,
    LeaderboardEntry,
    Problem,
    StageResultRow,
    Submission,
    SubmissionTokenStats,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
)

__all__ = [
    "AUDIT_STATUSES",
    "FINISHED",
    "ApiKey",
    "Audit",
    "Base",
    "LeaderboardEntry",
    "Problem",
    "StageResultRow",
    "Submission",
    "SubmissionTokenStats",
    "WebhookAttempt",
    "WebhookDelivery",
    "WebhookEndpoint",
    "new_id",
]
