"""The probes stage's numerics: input distributions, fp64-oracle error metrics, behavioural checks, diagnoses."""
