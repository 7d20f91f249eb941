"""The sandbox's typed protocol (worker.sandbox.protocol): every op has a request and a reply model, the parent refuses
a reply that does not validate, the child refuses a request that does not, and the generic sandbox imports none of
the packages whose ops it serves. Every child here is the real one (python -m worker.sandbox.child)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import worker.sandbox
from worker.catalogue import load_catalogue
from worker.engine import run_audit
from worker.formats import Solution
from worker.sandbox import MalformedReply, Sandbox, framing, protocol, registry, spill
from worker.sandbox.protocol import CallRequest, ErrorReply, HelloReply, HelloRequest, Reply, Request
from worker.sandbox.runner import scrubbed_env
from worker.stages.result import StageStatus

SANDBOX_DIR = Path(worker.sandbox.__file__).parent
SLOW = pytest.mark.slow  # starts a Python with torch, or a sandbox child: not in the fast subset
EMB = load_catalogue().get("embedding_backward")

# Appended to a correct kernel (the catalogue's fp32 example): once imported, it rewrites the child's reply frames on
# their way out (the harness's own framing.write_frame, patched through sys.modules); a reply with outputs gets MODE.
FORGER = """

import sys as _sys

_framing = _sys.modules["worker.sandbox.framing"]
_write = _framing.write_frame
MODE = "__MODE__"


def _forge(fd, frame):
    if "outputs" in frame:
        frame = dict(frame)
        if MODE == "missing":
            del frame["outputs"]
        elif MODE == "wrong_type":
            frame["exact_tensor_types"] = "yes"
        elif MODE == "extra":
            frame["verdict"] = "pass"
        elif MODE == "not_a_tensor":
            frame["outputs"] = [[0.0] * len(frame["outputs"])]
        elif MODE == "no_ok":
            del frame["ok"]
        elif MODE == "bad_error":
            frame = {"ok": False, "kind": "trusted", "error": 7, "nonce": frame["nonce"]}
    _write(fd, frame)


_framing.write_frame = _forge
"""

# what the parent's error names for each forgery: the field and what is wrong with it, never the forged value
REFUSALS = {
    "missing": "outputs: Field required",
    "wrong_type": "exact_tensor_types: Input should be a valid list",
    "extra": "verdict: Extra inputs are not permitted",
    "not_a_tensor": "outputs.0: Input should be an instance of Tensor",
    "no_ok": "ok: neither true nor false",
    "bad_error": "kind: Input should be 'harness' or 'submission'",
}


def _hostile(mode: str) -> Solution:
    honest = EMB.example_solution("pytorch_fp32")
    entry = honest.spec.entry_file
    sources = [
        src.model_copy(update={"content": src.content + FORGER.replace("__MODE__", mode)}) if src.path == entry else src
        for src in honest.sources
    ]
    return honest.model_copy(update={"name": f"hostile_reply_{mode}", "sources": sources})


def _emb_args() -> list[Any]:
    indices = torch.tensor([0, 2, 2, 1])
    return [indices, torch.ones(4, 3), 5, -1]


def test_every_registered_op_has_a_request_and_a_reply_model() -> None:
    handlers = registry.load_ops()
    assert {"hello", "warm", "load", "custom_inputs", "call", "time", "canary_train"} <= set(handlers)
    assert set(handlers) == set(protocol.REQUESTS), "an op without a handler, or a handler without models"
    for name in handlers:
        model = protocol.REQUESTS[name]
        assert issubclass(model, Request) and model.op == name
        assert issubclass(model.reply_type, Reply) and model.reply_type is not Reply
        assert model.model_config.get("extra") == "forbid" and model.reply_type.model_config.get("extra") == "forbid"


def test_a_request_model_must_name_its_reply_model() -> None:
    with pytest.raises(TypeError, match="does not name its reply model"):

        class Orphan(Request):  # type: ignore[type-arg]
            op = "orphan_op"


@SLOW
def test_the_generic_sandbox_imports_no_canary_or_stage_module() -> None:
    code = (
        "import sys\n"
        "import worker.sandbox, worker.sandbox.child, worker.sandbox.runner, worker.sandbox.pool, "
        "worker.sandbox.protocol, worker.sandbox.registry, worker.sandbox.harness\n"
        "print(sorted(m for m in sys.modules if m.startswith(('worker.canary', 'worker.stages'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout
    # nor lazily, inside a function: no import statement in the package names them
    for path in SANDBOX_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not [n for n in names if n.startswith(("worker.canary", "worker.stages"))], path.name


@pytest.fixture
def raw_child(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """The real child, spoken to frame by frame (unisolated: what is tested is its protocol, not its walls)."""
    (tmp_path / spill.FOLDER).mkdir()
    c_read, p_write = os.pipe()
    p_read, c_write = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker.sandbox.child", str(c_read), str(c_write)],
        cwd=tmp_path,
        env=scrubbed_env(tmp_path),
        pass_fds=(c_read, c_write),
        stdin=subprocess.DEVNULL,
    )
    os.close(c_read)
    os.close(c_write)
    try:
        yield p_write, p_read
    finally:
        os.close(p_write)
        os.close(p_read)
        proc.kill()
        proc.wait(30)


def _ask(child: tuple[int, int], frame: dict[str, Any]) -> dict[str, Any]:
    framing.write_frame(child[0], frame)
    return framing.read_frame(child[1])


@SLOW
@pytest.mark.parametrize(
    ("frame", "refusal"),
    [
        ({"op": "nope"}, "unknown op 'nope'"),
        ({"op": 7}, "unknown op 7"),
        ({"op": "call", "args": "not a list"}, "malformed 'call' request: args: Input should be a valid list"),
        ({"op": "call"}, "malformed 'call' request: args: Field required"),
        (
            {"op": "hello", "device": "cpu", "sneaky": 1},
            "malformed 'hello' request: sneaky: Extra inputs are not permitted",
        ),
        (
            {"op": "call", "args": [], "outputs": [{"shape": [1], "dtype": "os"}]},
            "outputs.0.dtype: Value error, 'os' is not",
        ),
        (
            {"op": "time", "args": [], "outputs": [], "warmup": 1, "reps": 0},
            "reps: Input should be greater than or equal to 1",
        ),
    ],
)
def test_the_child_refuses_an_unknown_op_or_a_malformed_request(
    raw_child: tuple[int, int], frame: dict[str, Any], refusal: str
) -> None:
    reply = _ask(raw_child, {**frame, "nonce": "n1"})
    assert reply.pop("nonce") == "n1" and reply.pop("ok") is False
    error = ErrorReply.model_validate(reply)
    assert error.kind == "harness" and refusal in error.error, error.error
    # refused, not broken: the next request is served
    hello = _ask(raw_child, {"op": "hello", "nonce": "n2", **HelloRequest().wire()})
    assert hello.pop("nonce") == "n2" and hello.pop("ok") is True
    assert HelloReply.model_validate(hello).pid > 0


@SLOW
@pytest.mark.parametrize("mode", sorted(REFUSALS))
def test_a_hostile_reply_is_refused_with_a_clear_error(mode: str) -> None:
    sol = _hostile(mode)
    with Sandbox("cpu", isolation="none", default_timeout_s=120) as sb:
        sb.load(sol)
        with pytest.raises(MalformedReply, match=f"malformed (error )?reply to 'call': {REFUSALS[mode]}") as caught:
            sb.send(CallRequest(args=_emb_args(), outputs=[{"shape": [5, 3], "dtype": "float32"}]))
        assert caught.value.kind == "crash"
        assert not sb.alive, "a child that lied is closed, not reused"
        sb.ensure(EMB.example_solution("pytorch_fp32"))  # the parent goes on: a fresh child serves the next audit
        reply = sb.send(CallRequest(args=_emb_args(), outputs=[{"shape": [5, 3], "dtype": "float32"}]))
    assert reply.outputs[0][2].tolist() == [2.0, 2.0, 2.0]


@SLOW
def test_the_parent_refuses_a_request_no_op_takes_before_sending_it() -> None:
    with Sandbox("cpu", isolation="none", default_timeout_s=120) as sb:
        with pytest.raises(ValueError, match="unknown op 'nope'"):
            sb.request("nope", {})
        with pytest.raises(ValueError, match="malformed 'call' request: sneaky: Extra inputs"):
            sb.request("call", {"args": [], "sneaky": True})
        assert sb.alive and sb.request("hello", {"device": "cpu"})["ok"] is True


@SLOW
def test_an_audit_of_a_kernel_that_forges_its_replies_fails_the_stage_and_the_worker_goes_on() -> None:
    report = run_audit(EMB, _hostile("extra"), stages=["intake", "benchmark"], seed=7, isolation="none")
    bench = {s.name: s for s in report.stages}["benchmark"]
    assert bench.status is StageStatus.failed, bench.summary
    assert "malformed reply to 'call': verdict: Extra inputs are not permitted" in bench.summary
    assert report.verdict.value == "fail"
