from app.models.base import Base, new_id
from app.audits.status import FINISHED
from app.models.tables import (
    AUDIT_STATUSES,
    ApiKey,
    Audit,
    Problem,
    StageResultRow,
    Submission,
    WebhookDelivery,
    WebhookEndpoint,
)

__all__ = [
    "AUDIT_STATUSES", "FINISHED", "ApiKey", "Audit", "Base", "Problem", "StageResultRow", "Submission",
    "WebhookDelivery", "WebhookEndpoint", "new_id",
]
