"""Routing a submission to a device by its languages and target_hardware and the deployment's devices; a solution no
device here can run is refused at POST (422 naming the field and the deployment's devices) and nothing is stored."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import test_api
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from svc_support import example
from test_api import auth

from app.core.settings import Settings
from app.main import create_app
from app.models import Audit, Submission
from app.submissions.devices import NoDeviceForSolution, choose_device
from worker.formats import Language, Solution

# the API on the embedded default's storage (the refusal happens before anything touches the database)
sqlite_api = test_api.sqlite_api

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "solexecbench"


def _sol(hw: list[str], languages: list[Language] | None = None) -> Solution:
    languages = languages or ["triton"]
    entry = "k.cu" if languages[0] in ("cuda_cpp", "cutlass", "cudnn", "cublas") else "k.py"
    return Solution.model_validate(
        {
            "name": "k",
            "definition": "embedding_backward",
            "spec": {"languages": languages, "target_hardware": hw, "entry_point": f"{entry}::run"},
            "sources": [{"path": entry, "content": "def run(): pass\n"}],
        }
    )


@pytest.mark.parametrize(
    "hw, kinds, unknown",
    [
        (["cuda"], {"cuda"}, []),
        (["H100", "B200"], {"cuda"}, []),
        (["NVIDIA_H200"], {"cuda"}, []),
        (["cpu", "cuda"], {"cpu", "cuda"}, []),
        (["LOCAL"], {"cpu", "cuda"}, []),
        (["x86_64"], {"cpu"}, []),
        (["TPUv5"], set(), ["TPUv5"]),
    ],
)
def test_target_hardware_names_map_to_device_kinds(hw: list[str], kinds: set[str], unknown: list[str]) -> None:
    assert _sol(hw).spec.device_kinds() == (kinds, unknown)


def test_a_gpu_kernel_goes_to_the_gpu_when_the_deployment_has_one() -> None:
    both = Settings(audit_devices="cpu,cuda")
    assert choose_device(_sol(["cuda"]), both) == "cuda"
    assert choose_device(_sol(["B200"]), both) == "cuda"
    assert choose_device(_sol(["cpu", "cuda"]), both) == "cuda"  # its real target
    assert choose_device(_sol(["LOCAL"]), both) == "cuda"  # LOCAL: any, the GPU first
    assert choose_device(_sol(["cpu"]), both) == "cpu"
    assert choose_device(_sol([]), both) == "cpu"  # names none: the deployment's default
    assert both.queue_for("cuda").endswith("gpu") and both.queue_for("cpu").endswith("cpu")


def test_gpu_only_languages_go_to_the_gpu_whatever_the_hardware_list_allows() -> None:
    both = Settings(audit_devices="cpu,cuda")
    for lang in ("cute_dsl", "cutile", "cudnn_frontend", "cuda_cpp", "cutlass", "cudnn", "cublas"):
        assert choose_device(_sol([], [lang]), both) == "cuda", lang  # the default (cpu) cannot run it
        assert choose_device(_sol(["LOCAL"], [lang]), both) == "cuda", lang
    with pytest.raises(NoDeviceForSolution, match=r"names only the CPU, but spec.languages \['cute_dsl'\]") as info:
        choose_device(_sol(["cpu"], ["cute_dsl"]), both)
    assert info.value.field == "spec.target_hardware"


def test_a_cpu_only_deployment_takes_portable_kernels_and_refuses_gpu_only_ones() -> None:
    cpu = Settings()
    assert cpu.devices == ["cpu"]
    assert choose_device(_sol(["cpu", "cuda"]), cpu) == "cpu"
    assert choose_device(_sol(["LOCAL"], ["pytorch"]), cpu) == "cpu"
    assert choose_device(_sol(["LOCAL"], ["triton"]), cpu) == "cpu"  # Triton's interpreter runs on the CPU
    with pytest.raises(NoDeviceForSolution, match=r"needs cuda, but this deployment audits on cpu only"):
        choose_device(_sol(["H100"]), cpu)
    with pytest.raises(NoDeviceForSolution, match="names no device"):
        choose_device(_sol(["TPUv5"]), cpu)
    for lang in ("cute_dsl", "cuda_cpp"):
        with pytest.raises(NoDeviceForSolution) as info:
            choose_device(_sol(["LOCAL"], [lang]), cpu)
        assert info.value.field == "spec.languages"
        assert f"{lang} run only on an NVIDIA GPU (CUDA), but this deployment audits on cpu only" in str(info.value)


def test_a_gpu_only_deployment_refuses_cpu_only_kernels() -> None:
    gpu = Settings(device="cuda", audit_devices="cuda")
    assert choose_device(_sol([]), gpu) == "cuda"
    assert choose_device(_sol([], ["cutile"]), gpu) == "cuda"
    with pytest.raises(NoDeviceForSolution, match="needs cpu"):
        choose_device(_sol(["cpu"]), gpu)


def _count(client: TestClient, model: type[Any]) -> int:
    with client.app.state.services.sessions() as s:  # type: ignore[attr-defined]
        return int(s.scalar(select(func.count()).select_from(model)))


@pytest.mark.parametrize("lang", ["cute_dsl", "cutile", "cudnn_frontend", "cuda_cpp", "cutlass", "cublas", "cudnn"])
def test_api_refuses_a_gpu_only_language_on_a_cpu_deployment_and_queues_nothing(sqlite_api, lang: str) -> None:  # type: ignore[no-untyped-def]
    client, keys, settings = sqlite_api
    assert settings.devices == ["cpu"]
    sol = json.loads((FIXTURES / f"solution_{lang}.json").read_text())
    sol["definition"] = "embedding_backward"  # a catalogue definition: only the device can refuse it
    r = client.post("/v1/submissions", json=sol, headers=auth(keys["alice"]))
    assert r.status_code == 422, r.text
    (err,) = r.json()["errors"]
    assert err["field"] == "spec.languages"
    assert (
        "run only on an NVIDIA GPU (CUDA), but this deployment audits on cpu only" in err["reason"]
        and lang in err["reason"]
    )
    assert _count(client, Submission) == 0 and _count(client, Audit) == 0


@pytest.mark.parametrize(("dependency", "lang"), [("cutlass", "cute_dsl"), ("cutile", "cutile")])
def test_api_refuses_an_older_form_gpu_dsl_on_a_cpu_deployment(sqlite_api, dependency: str, lang: str) -> None:  # type: ignore[no-untyped-def]
    # SOL-ExecBench's earlier form: "language": "python", the DSL named only in dependencies. Read as PyTorch, it
    # would be queued to the CPU and fail at import; it is refused up front like its spec.languages twin
    client, keys, _ = sqlite_api
    sol = example("pytorch_fp32")
    sol["spec"] = {k: v for k, v in sol["spec"].items() if k != "languages"} | {
        "language": "python",
        "dependencies": ["torch", dependency],
        "target_hardware": ["B200", "LOCAL"],
    }
    r = client.post("/v1/submissions", json=sol, headers=auth(keys["alice"]))
    assert r.status_code == 422, r.text
    (err,) = r.json()["errors"]
    assert lang in err["reason"] and "but this deployment audits on cpu only" in err["reason"]
    assert _count(client, Submission) == 0 and _count(client, Audit) == 0


def test_api_queues_a_gpu_only_language_for_the_gpu_workers(sqlite_api) -> None:  # type: ignore[no-untyped-def]
    client, keys, settings = sqlite_api
    sol = example("pytorch_fp32")
    sol["spec"] = {**sol["spec"], "languages": ["cute_dsl"]}
    both = settings.model_copy(update={"audit_devices": "cpu,cuda"})
    with TestClient(create_app(both)) as gpu_client:
        r = gpu_client.post("/v1/submissions", json=sol, headers=auth(keys["alice"]))
        assert r.status_code == 202, r.text
        with gpu_client.app.state.services.sessions() as s:  # type: ignore[attr-defined]
            (audit,) = s.scalars(select(Audit)).all()
    assert (audit.device, audit.queue) == ("cuda", settings.queue_prefix + "gpu")
    # a pytorch kernel written in the older form is still taken, on the CPU of a CPU-only deployment
    older = example("pytorch_fp32")
    older["spec"] = {k: v for k, v in older["spec"].items() if k != "languages"} | {"language": "python"}
    assert client.post("/v1/submissions", json=older, headers=auth(keys["alice"])).status_code == 202
