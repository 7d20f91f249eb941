"""The reference of an uploaded definition, run in a sandbox of its own.

A curated definition's reference is part of the catalogue, reviewed and trusted, and runs in the
trusted parent. An uploaded one is the uploader's code: it runs isolated exactly like a kernel, in a
second sandbox child, and hands back tensors only. The verdicts of such an audit are only as good as
that reference (the uploader defines what "correct" means), and the report says so; what the isolation
guarantees is that the reference cannot touch the service, the judge or another submission."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from worker.formats import Definition, Solution, SolutionSpec, SourceFile
from worker.sandbox import Isolation, Sandbox
from worker.sandbox.protocol import CallRequest, CustomInputsRequest

REFERENCE_FILE = "reference.py"


def reference_as_solution(definition: Definition) -> Solution:
    """The reference source as a value-returning solution, so the sandbox can load and call it."""
    return Solution(
        name=f"reference of {definition.name}",
        definition=definition.name,
        author="uploader",
        spec=SolutionSpec(languages=["pytorch"], entry_point=f"{REFERENCE_FILE}::run", destination_passing_style=False),
        sources=[SourceFile(path=REFERENCE_FILE, content=definition.reference)],
    )


class SandboxedReference:
    """Presents the trusted Reference's interface (`run`, `run_fn`), each call a request to its own child."""

    trusted = False

    def __init__(
        self,
        definition: Definition,
        device: str = "cpu",
        *,
        timeout_s: float = 120.0,
        interrupts: tuple[type[BaseException], ...] = (),
        isolation: Isolation | None = None,
    ) -> None:
        self.definition = definition
        self._solution = reference_as_solution(definition)
        self._sandbox = Sandbox(device, default_timeout_s=timeout_s, interrupts=interrupts, isolation=isolation)

    def run(self, args: list[Any], reorder: str | None = None) -> list[torch.Tensor]:
        """The reference's outputs; `reorder` (worker.numerics.reorder) re-runs it with its reductions in another
        honest order, in its sandbox."""
        # the request and its reply are our own serialisation: a TorchFunctionMode around this call (the generic
        # oracle's promotion) must not rewrite the tensors that torch.load rebuilds
        with torch._C.DisableTorchFunction():
            return self._run(args, reorder)

    def _run(self, args: list[Any], reorder: str | None) -> list[torch.Tensor]:
        self._sandbox.ensure(self._solution)
        # the reply's outputs are plain tensors: anything else fails its validation (MalformedReply)
        reply = self._sandbox.send(
            CallRequest(args=[a.cpu() if isinstance(a, torch.Tensor) else a for a in args], reorder=reorder)
        )
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
        return [o.to(device) for o in reply.outputs]

    @property
    def run_fn(self) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            outs = self.run(list(args))
            return outs[0] if len(outs) == 1 else tuple(outs)

        return run

    def custom_inputs(
        self, axes_and_scalars: dict[str, Any], device: torch.device, seed: int
    ) -> dict[str, torch.Tensor]:
        """The definition's custom inputs, made by its own code in this reference's sandbox (seeded there)."""
        name = self.definition.custom_inputs_entrypoint
        if not name:
            raise ValueError(
                f"{self.definition.name}: a workload asks for custom inputs but the definition has no custom_inputs_entrypoint"
            )
        self._sandbox.ensure(self._solution)
        # a dict of name -> plain tensor, or the reply fails its validation (MalformedReply)
        reply = self._sandbox.send(
            CustomInputsRequest(entrypoint=name, seed=int(seed), axes_and_scalars=dict(axes_and_scalars))
        )
        return {k: v.to(device) for k, v in reply.inputs.items()}

    def close(self) -> None:
        self._sandbox.close()
