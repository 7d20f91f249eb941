"""The definition's PyTorch reference, run in the trusted process, and the interface every reference presents.

Only a curated definition's reference (reviewed, part of the catalogue) is ever a `Reference`: its source is
executed here. An uploaded one is a `worker.sandboxed_reference.SandboxedReference`, with the same interface,
each call a request to a sandbox child. Code that needs a reference takes a `ReferenceRunner` from the audit
(worker.context.AuditContext.reference) and never builds one from a definition itself."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

import torch

from worker.formats import Definition


class ReferenceRunner(Protocol):
    """What the stages need of a reference, wherever it runs."""

    definition: Definition

    @property
    def trusted(self) -> bool: ...

    @property
    def run_fn(self) -> Callable[..., Any]: ...

    def run(self, args: list[Any], reorder: str | None = None) -> list[torch.Tensor]: ...

    def custom_inputs(
        self, axes_and_scalars: dict[str, Any], device: torch.device, seed: int
    ) -> dict[str, torch.Tensor]: ...


@dataclass(frozen=True)
class Reference:
    definition: Definition
    module: ModuleType
    trusted: bool = True

    @classmethod
    def of(cls, definition: Definition) -> "Reference":
        module = ModuleType(f"kaudit_reference_{definition.name}")
        exec(compile(definition.reference, f"<reference {definition.name}>", "exec"), module.__dict__)
        return cls(definition=definition, module=module)

    @property
    def run_fn(self) -> Callable[..., Any]:
        return self.module.run  # type: ignore[no-any-return]

    def run(self, args: list[Any], reorder: str | None = None) -> list[torch.Tensor]:
        """Value-returning reference: outputs in the definition's output order; `reorder` re-runs it with its
        reductions in another honest order (worker.numerics.reorder)."""
        if reorder is not None:
            from worker.numerics.reorder import Reorder

            with Reorder(reorder):  # type: ignore[arg-type]
                out = self.run_fn(*args)
        else:
            out = self.run_fn(*args)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    def custom_inputs(
        self, axes_and_scalars: dict[str, Any], device: torch.device, seed: int
    ) -> dict[str, torch.Tensor]:
        name = self.definition.custom_inputs_entrypoint
        torch.manual_seed(seed)
        if not name:
            raise ValueError(
                f"{self.definition.name}: a workload asks for custom inputs but the definition has no custom_inputs_entrypoint"
            )
        return getattr(self.module, name)(axes_and_scalars, device)  # type: ignore[no-any-return]
