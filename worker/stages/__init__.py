"""Audit stages: each returns a StageResult (worker.stages.result)."""
