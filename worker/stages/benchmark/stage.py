"""The stage's name and its round count, in one place for every module of the stage.

ROUNDS also decides how many seeds the stage draws per workload (AuditContext.derive_seed), so changing it changes
every audit's inputs and evidence."""

NAME = "benchmark"
ROUNDS = 10
