"""Markers from what a test uses, so that `pytest -m "not services and not slow"` is a fast subset.

services: the test uses a fixture that needs the real Postgres or Redis, or starts a server process (a Celery
worker, uvicorn, `kaudit serve`); an API fixture parametrized over databases is services for its Postgres case.
slow: the whole file is slow (measured with --durations: each starts sandboxes, runs canaries, or audits end to end).
Marks a file sets itself (pytestmark, decorators) still apply."""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

# fixtures (by name, anywhere in a test's fixture closure) that need or start a service
SERVICE_FIXTURES = frozenset(
    {
        # tests/app/conftest.py: a fresh Postgres database, real Redis
        "_need_postgres",
        "_need_redis",
        "pg_url",
        "service_settings",
        # servers in child processes (tests/app/svc_support.py's Proc, or `kaudit serve`)
        "uvicorn_info",  # test_security_query_key: uvicorn as the Dockerfile starts it
        "dashboard",  # test_security_csp_browser: uvicorn for the browser
        "service",  # test_dashboard_browser (`kaudit serve`), test_definition_upload (API and worker processes)
        "fuzz_target",  # test_fuzz: Postgres and Redis
    }
)
# parametrized fixtures that pick their settings with request.getfixturevalue (outside the static closure)
SERVICE_PARAMS = frozenset({"postgres"})

# files whose tests start sandbox children, train canaries, build in the sandbox or audit end to end in a subprocess
# (--durations: 2 to 60 s a test on this 2-core machine); paths relative to tests/
SLOW_FILES = frozenset(
    {
        # audits through the CLI and the benchmark scripts, in subprocesses
        "app/test_cli.py",
        "app/test_cli_import.py",
        "app/test_cli_traces.py",
        "app/test_token_stats_api.py",
        "app/test_worker_canary_warm.py",
        "benchmarks/test_benchmark_scripts.py",
        "benchmarks/test_parallel_budget.py",
        # the sandbox: isolation, exploits, the spare pool, memory limits, spilled tensors, compiles
        "worker/sandbox/test_exploits.py",
        "worker/sandbox/test_isolation.py",
        "worker/sandbox/test_memory_limit.py",
        "worker/sandbox/test_pool.py",
        "worker/sandbox/test_uploaded_reference_trust.py",
        "worker/test_sandbox.py",
        "worker/test_sandbox_spill.py",
        "worker/test_build_sandbox.py",
        "worker/test_out_of_memory.py",
        # canaries: real-text training runs
        "worker/test_canary.py",
        "worker/test_canary_lazy_nulls.py",
        "worker/test_canary_parent_cache.py",
        "worker/test_canary_stacked.py",
        "worker/test_canary_wire.py",
        "worker/test_text_warm.py",
        # stages and catalogue problems run against example kernels in sandbox children
        "worker/test_intake_stage.py",
        "worker/test_benchmark_stage.py",
        "worker/test_probes_stage.py",
        "worker/test_timing_floor.py",
        "worker/test_timing_lock.py",
        "worker/test_speedup_ci.py",
        "worker/test_cheats.py",
        "worker/test_catalogue_embedding.py",
        "worker/test_catalogue_new_definitions.py",
        "worker/test_catalogue_norm_ce.py",
        "worker/test_curated_layernorm_rope.py",
        "worker/test_dataset_import.py",
        "worker/test_generated_inputs.py",
        "worker/test_generic_probe_domain.py",
        "worker/test_generic_probes.py",
        "worker/test_traces.py",
    }
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        params = callspec.params.values() if callspec is not None else ()
        if names & SERVICE_FIXTURES or any(isinstance(p, str) and p in SERVICE_PARAMS for p in params):
            item.add_marker(pytest.mark.services)
        if item.path.relative_to(TESTS).as_posix() in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
