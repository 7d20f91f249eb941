"""The trust boundary: the submission's process is scrubbed, killed whole on timeout, and can't forge replies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from worker.formats import Solution
from worker.sandbox import Isolation, Sandbox, SandboxCrash, SandboxTimeout, SubmissionError, namespaces_available
from worker.sandbox.isolation import processes_in_pid_namespace


def _solution(body: str, dps: bool = True) -> Solution:
    return Solution.model_validate(
        {
            "name": "probe",
            "definition": "embedding_backward",
            "spec": {"language": "python", "entry_point": "k.py::run", "destination_passing_style": dps},
            "sources": [{"path": "k.py", "content": body}],
        }
    )


def test_environment_is_scrubbed_and_home_is_private(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://secret@db/prod")
    monkeypatch.setenv("KAUDIT_WEBHOOK_SECRET", "s3cret")
    body = (
        "import os, torch\n"
        "def run(x):\n"
        "    seen = [k for k in ('DATABASE_URL', 'KAUDIT_WEBHOOK_SECRET', 'REDIS_URL') if k in os.environ]\n"
        "    return torch.tensor([len(seen), len(os.environ.get('HOME', '')) > 0, os.getcwd() == os.environ['HOME']])\n"
    )
    with Sandbox("cpu") as sb:
        sb.load(_solution(body, dps=False))
        out = sb.request("call", {"args": [torch.zeros(1)], "outputs": [], "poison": None})["outputs"][0]
    assert out.tolist() == [0, 1, 1]


@pytest.mark.parametrize("isolation", ["namespaces", "none"])
def test_timeout_kills_everything_the_submission_started(isolation: Isolation) -> None:
    """Unisolated, the process group is killed; isolated, the whole PID namespace (setsid daemons included)."""
    if isolation == "namespaces" and not namespaces_available():
        pytest.skip("bubblewrap namespaces are not available here")
    body = (
        "import subprocess, sys, time\n"
        "def run(x):\n"
        "    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "    time.sleep(600)\n"
    )
    sb = Sandbox("cpu", isolation=isolation)
    sb.start()
    sb.load(_solution(body, dps=False))
    assert sb._proc is not None
    pid, ns = sb._proc.pid, sb.pid_namespace
    t0 = time.monotonic()
    with pytest.raises(SandboxTimeout):
        sb.request("call", {"args": [torch.zeros(1)], "outputs": [], "poison": None}, timeout_s=3)
    assert time.monotonic() - t0 < 20
    if ns is not None:
        assert processes_in_pid_namespace(ns) == []
    else:
        time.sleep(0.5)
        leftovers = [
            int(d) for d in os.listdir("/proc") if d.isdigit() and _pgid(int(d)) == pid and not _zombie(int(d))
        ]
        assert leftovers == []
    assert not sb.alive


def test_the_child_dies_when_its_parent_is_killed_outright(tmp_path: Path) -> None:
    """The child has its own session, so only PR_SET_PDEATHSIG takes it down with a SIGKILLed worker."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import sys, torch\n"
        "from worker.formats import Solution\n"
        "from worker.sandbox import Sandbox\n"
        "sb = Sandbox('cpu')\n"
        "sb.start()\n"
        "sb.load(Solution.model_validate_json(sys.argv[1]))\n"
        "print(sb._proc.pid, sb.pid_namespace or 0, flush=True)\n"
        "sb.request('call', {'args': [torch.zeros(1)], 'outputs': [], 'poison': None}, timeout_s=600)\n"
    )
    # busy in the kernel, the child never reads the pipe, so it cannot notice that the parent is gone
    busy = _solution("import time\ndef run(x):\n    time.sleep(600)\n", dps=False)
    parent = subprocess.Popen(
        [sys.executable, str(script), busy.model_dump_json()],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    child = -1
    try:
        assert parent.stdout is not None
        child, ns = (int(v) for v in parent.stdout.readline().split())
        assert not _zombie(child)
        time.sleep(1.0)  # the call is under way
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while not _zombie(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _zombie(child), "the sandbox child outlived its killed parent"
        if ns:  # isolated: bwrap's init dies with it, and with init everything in its namespace
            deadline = time.monotonic() + 10
            while processes_in_pid_namespace(ns) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert processes_in_pid_namespace(ns) == []
    finally:
        parent.kill()
        if child > 0 and not _zombie(child):
            os.kill(child, signal.SIGKILL)


def _zombie(pid: int) -> bool:
    """Killed and waiting to be reaped by init: no longer running."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def test_submission_exception_comes_back_as_data_and_the_process_lives_on() -> None:
    body = "def run(x):\n    raise ValueError('bad shape')\n"
    with Sandbox("cpu") as sb:
        sb.load(_solution(body, dps=False))
        with pytest.raises(SubmissionError, match="ValueError: bad shape"):
            sb.request("call", {"args": [torch.zeros(1)], "outputs": [], "poison": None})
        assert sb.alive
        assert sb.request("hello", {"device": "cpu"})["ok"]


def test_exit_mid_call_is_a_crash() -> None:
    with Sandbox("cpu") as sb:
        sb.load(_solution("import os\ndef run(x):\n    os._exit(0)\n", dps=False))
        with pytest.raises(SandboxCrash):
            sb.request("call", {"args": [torch.zeros(1)], "outputs": [], "poison": None})


def test_forged_reply_without_the_nonce_is_rejected() -> None:
    # the submission writes its own 'ok' frame on the reply pipe, then returns normally
    body = (
        "import sys, torch\n"
        "from worker.sandbox import framing\n"
        "def run(x):\n"
        "    framing.write_frame(int(sys.argv[2]), {'ok': True, 'outputs': [torch.ones(1)]})\n"
        "    return torch.zeros(1)\n"
    )
    with Sandbox("cpu") as sb:
        sb.load(_solution(body, dps=False))
        with pytest.raises(SandboxCrash, match="out of sequence"):
            sb.request("call", {"args": [torch.zeros(1)], "outputs": [], "poison": None})


def test_outputs_are_poisoned_and_returned_as_plain_tensors() -> None:
    # DPS kernel that writes nothing: the poison is what comes back
    with Sandbox("cpu") as sb:
        sb.load(_solution("def run(x, y):\n    pass\n"))
        rep = sb.request(
            "call", {"args": [torch.zeros(2)], "outputs": [{"shape": [2], "dtype": "bfloat16"}], "poison": float("nan")}
        )
    (out,) = rep["outputs"]
    assert out.dtype == torch.bfloat16 and torch.isnan(out).all()
    assert rep["exact_tensor_types"] == [True]


class _Interrupt(Exception):
    """Stands for Celery's SoftTimeLimitExceeded, raised by a signal handler in the middle of a request."""


def test_an_interrupt_mid_request_propagates_and_kills_the_child() -> None:
    sb = Sandbox("cpu", interrupts=(_Interrupt,))
    sb.start()
    sb.load(_solution("import time\ndef run(x):\n    time.sleep(600)\n", dps=False))
    assert sb._proc is not None
    pid = sb._proc.pid

    def interrupt(*_: object) -> None:
        raise _Interrupt()

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.alarm(1)
    try:
        with pytest.raises(_Interrupt):  # not converted into a SandboxCrash or a timeout
            sb.request("call", {"args": [torch.zeros(1)], "outputs": [], "poison": None}, timeout_s=60)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert not sb.alive and _zombie(pid)


def test_an_output_flood_is_drained_and_capped_and_the_kernel_still_runs() -> None:
    """A kernel that prints 100 MB: the parent drains and caps it (no 'File too large', no blocked child) and says so."""
    body = (
        "import sys, torch\n"
        "def run(x):\n"
        "    line = 'x' * 1023 + '\\n'\n"
        "    for _ in range(100 * 1024):\n"
        "        sys.stdout.write(line)\n"
        "    sys.stdout.write('THE-LAST-LINE\\n')\n"
        "    sys.stdout.flush()\n"
        "    return x + 1\n"
    )
    with Sandbox("cpu") as sb:
        sb.load(_solution(body, dps=False))
        out = sb.request("call", {"args": [torch.zeros(3)], "outputs": [], "poison": None})["outputs"][0]
        assert out.tolist() == [1.0, 1.0, 1.0]
        deadline = time.monotonic() + 60  # the parent's drain thread reads the pipe on its own: wait for the last line
        while "THE-LAST-LINE" not in sb.log_tail() and time.monotonic() < deadline:
            time.sleep(0.05)
        log = sb.log_tail()
        assert len(log) <= 4000 and "THE-LAST-LINE" in log
        assert "bytes of the submission's output dropped" in log
