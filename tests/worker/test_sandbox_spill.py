"""Large tensors cross the trust boundary as files: same results as the pipe, nothing left behind, hostile files refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from worker import generated
from worker.formats import Solution
from worker.numerics import checks
from worker.sandbox import Sandbox, spill

BIG = (1024, 1024)  # 4 MB in fp32: over SPILL_BYTES


def _solution(body: str, dps: bool = True) -> Solution:
    return Solution.model_validate(
        {
            "name": "spill",
            "definition": "rmsnorm_forward",
            "spec": {"language": "python", "entry_point": "k.py::run", "destination_passing_style": dps},
            "sources": [{"path": "k.py", "content": body}],
        }
    )


def _spill_files(sb: Sandbox) -> list[str]:
    return sorted(os.listdir(sb._spill_dir))


def test_large_inputs_and_outputs_round_trip_through_files() -> None:
    assert torch.empty(BIG).nbytes >= spill.SPILL_BYTES
    x = torch.randn(BIG)
    small = torch.randn(4)
    with Sandbox("cpu") as sb:
        sb.load(_solution("def run(x, s, out, out_small):\n    out.copy_(x * 2)\n    out_small.copy_(s + 1)\n"))
        reply = sb.request(
            "call",
            {
                "args": [x, small],
                "outputs": [{"shape": list(BIG), "dtype": "float32"}, {"shape": [4], "dtype": "float32"}],
                "poison": float("nan"),
            },
        )
        assert _spill_files(sb) == []  # inputs removed after the reply, outputs after they were read
    assert torch.equal(reply["outputs"][0], x * 2)
    assert torch.equal(reply["outputs"][1], small + 1)
    assert torch.equal(reply["args_after"][0], x)


def test_a_kernel_that_writes_into_its_large_input_is_seen_and_the_parent_copy_is_untouched() -> None:
    x = torch.ones(BIG)
    with Sandbox("cpu") as sb:
        sb.load(_solution("def run(x, out):\n    x.mul_(3)\n    out.copy_(x)\n"))
        reply = sb.request("call", {"args": [x], "outputs": [{"shape": list(BIG), "dtype": "float32"}], "poison": None})
    assert torch.equal(x, torch.ones(BIG))  # the parent's own inputs never reach the child
    assert torch.equal(reply["args_after"][0], torch.full(BIG, 3.0))


def test_with_digest_after_the_inputs_come_back_as_digests_that_show_a_write() -> None:
    """The probes stage's way: no copy of the inputs comes back, a digest does, and the check still sees a
    kernel that wrote into one input (even a single element's zero turned to minus zero)."""
    x, y = torch.zeros(BIG), torch.randn(BIG)
    with Sandbox("cpu") as sb:
        sb.load(_solution("def run(x, y, out):\n    x[7, 9] = -0.0\n    out.copy_(y)\n"))
        reply = sb.request(
            "call",
            {
                "args": [x, y],
                "outputs": [{"shape": list(BIG), "dtype": "float32"}],
                "poison": None,
                "digest_after": True,
            },
        )
    assert all(generated.is_digest(a) for a in reply["args_after"])
    result = checks.check_inputs_unmodified(["x", "y"], [("probe", [x, y], reply["args_after"])])
    assert not result.passed and result.details["mutated"] == {"x": ["probe"]}


def test_bfloat16_and_int64_keep_their_bits() -> None:
    t = torch.randn(BIG).to(torch.bfloat16)
    ids = torch.randint(0, 1 << 40, (200_000,))
    with Sandbox("cpu") as sb:
        sb.load(_solution("def run(t, ids):\n    return t.clone(), ids.clone()\n", dps=False))
        reply = sb.request("call", {"args": [t, ids], "outputs": [], "poison": None})
    assert reply["outputs"][0].dtype == torch.bfloat16 and torch.equal(reply["outputs"][0], t)
    assert torch.equal(reply["outputs"][1], ids)


@pytest.mark.parametrize(
    "descriptor, why",
    [
        ({"__spill__": "../child.log", "dtype": "float32", "shape": [1]}, "name"),
        ({"__spill__": "outputs-ab-0.bin", "dtype": "object", "shape": [1]}, "dtype"),
        ({"__spill__": "outputs-ab-0.bin", "dtype": "float32", "shape": [-1]}, "shape"),
        ({"__spill__": "outputs-ab-0.bin", "dtype": "float32", "shape": [1000]}, "bytes"),
    ],
)
def test_the_parent_refuses_descriptors_that_lie(tmp_path: Path, descriptor: dict[str, object], why: str) -> None:
    (tmp_path / "outputs-ab-0.bin").write_bytes(b"\0" * 16)
    folder = spill.open_folder(tmp_path)
    try:
        with pytest.raises(spill.SpillError, match=why):
            spill.read_copy(folder, descriptor)
    finally:
        os.close(folder)


def test_the_parent_does_not_follow_a_symlink_planted_as_a_spill_file(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"\1" * 4)
    (tmp_path / "outputs-ab-0.bin").symlink_to(secret)
    folder = spill.open_folder(tmp_path)
    try:
        with pytest.raises(OSError):
            spill.read_copy(folder, {"__spill__": "outputs-ab-0.bin", "dtype": "float32", "shape": [1]})
    finally:
        os.close(folder)
    assert secret.read_bytes() == b"\1" * 4 and not (tmp_path / "outputs-ab-0.bin").exists()
