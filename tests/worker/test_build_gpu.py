"""A CUDA C++ solution (SOL-ExecBench's cuda_cpp) is built with nvcc in the sandbox for this GPU and runs on it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from worker.build import BuildCache, BuildRequest, CompileBudget, build, discover
from worker.sandbox.isolation import namespaces_available

from tests.worker.test_build_sandbox import in_fresh_process

VECADD = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

__global__ void vecadd_kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out,
                              int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}

void run(torch::Tensor a, torch::Tensor b, torch::Tensor out) {  // destination-passing style
  TORCH_CHECK(a.is_cuda() && a.is_contiguous() && a.scalar_type() == torch::kFloat32, "a: contiguous float32 CUDA");
  int64_t n = a.numel();
  int threads = 256;
  vecadd_kernel<<<(n + threads - 1) / threads, threads>>>(a.data_ptr<float>(), b.data_ptr<float>(),
                                                          out.data_ptr<float>(), n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &run, "out = a + b"); }
"""


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.skipif(not namespaces_available(), reason="needs bubblewrap namespaces")
def test_cuda_vecadd_extension_builds_with_nvcc_in_the_sandbox_and_runs_on_the_gpu(tmp_path: Path) -> None:
    tc = discover()
    assert tc.cuda_home is not None, "this worker has no nvcc"
    major, minor = torch.cuda.get_device_capability()
    req = BuildRequest.model_validate(
        {
            "sources": [{"path": "vecadd.cu", "content": VECADD}],
            "languages": ["cuda_cpp"],
            "entry_symbol": "run",
            "target_arch": f"sm_{major}{minor}",
            "cuda_cflags": ["-lineinfo"],
            "ld_flags": ["-lcudart"],
        }
    )
    cache = BuildCache(tmp_path / "cache")
    result = build(req, cache=cache, budget=CompileBudget(wall_s=600))
    assert result.ok, (result.message, result.first_errors, result.compiler_log_tail)
    assert result.isolation == "namespaces"
    print(f"\nCUDA vecadd (nvcc {tc.nvcc_version}, sm_{major}{minor}): compiled in {result.compile_seconds:.1f} s")

    assert result.artifact is not None and result.artifact_sha256 is not None
    ran = in_fresh_process(
        result.artifact,
        result.artifact_sha256,
        """
a = torch.randn(1_000_003, device="cuda")
b = torch.randn_like(a)
out = torch.full_like(a, float("nan"))
fn(a, b, out)
torch.cuda.synchronize()
torch.testing.assert_close(out, a + b, rtol=0, atol=0)
print("exact", out.device.type, out.numel())
""",
    )
    assert ran == "exact cuda 1000003"

    again = build(req, cache=cache)
    assert again.cached and again.artifact_sha256 == result.artifact_sha256
