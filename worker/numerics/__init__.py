"""Numerics shared by the stages: the benchmark's tolerance rule, timing, fp64 error metrics and output checks."""
