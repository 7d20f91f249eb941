"""The stage result types live in the engine-to-service contract, worker.report."""

from worker.report import AuditOutcome, AuditReport, StageName, StageResult, StageStatus, Verdict, VerdictSummary

__all__ = ["AuditOutcome", "AuditReport", "StageName", "StageResult", "StageStatus", "Verdict", "VerdictSummary"]
