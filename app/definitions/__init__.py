"""Definitions uploaded by users (SOL-ExecBench definition + workloads), stored as problems of origin 'uploaded'."""
