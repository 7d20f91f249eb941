"""A definition with its workloads, as a user holds them (an uploaded or local SOL-ExecBench problem).

No torch here: the API validates bundles before anything runs."""

from __future__ import annotations

import ast
import hashlib
import json

from pydantic import BaseModel, ConfigDict, Field, model_validator

from worker.formats.definition import Definition
from worker.formats.workload import Workload

MAX_WORKLOADS = 64


class DefinitionBundle(BaseModel):
    """definition.json and its workloads; `workloads_cpu` are the CPU-sized ones (default: the same)."""

    model_config = ConfigDict(extra="forbid")
    definition: Definition
    workloads: list[Workload] = Field(min_length=1, max_length=MAX_WORKLOADS)
    workloads_cpu: list[Workload] | None = Field(default=None, max_length=MAX_WORKLOADS)

    @model_validator(mode="after")
    def _consistent(self) -> DefinitionBundle:
        d = self.definition
        problems: list[str] = []
        try:
            tree = ast.parse(d.reference)
        except SyntaxError as e:
            raise ValueError(f"definition.reference: syntax error at line {e.lineno}: {e.msg}") from None
        if not any(isinstance(n, ast.FunctionDef) and n.name == "run" for n in tree.body):
            problems.append("definition.reference: defines no top-level function 'run'")
        var_axes = {name for name, a in d.axes.items() if a.type == "var"}
        for label, ws in (("workloads", self.workloads), ("workloads_cpu", self.workloads_cpu or [])):
            for w in ws:
                unknown = set(w.inputs) - set(d.inputs)
                if unknown:
                    problems.append(f"{label}[{w.uuid}]: inputs {sorted(unknown)} are not in the definition")
                missing = var_axes - set(w.axes)
                if missing:
                    problems.append(f"{label}[{w.uuid}]: no value for the var axes {sorted(missing)}")
                # custom inputs are made by the definition's own code, in its sandbox (worker.sandboxed_reference);
                # a safetensors input names a file, which an upload carries no way to ship
                blobs = [n for n, i in w.inputs.items() if i.type == "safetensors"]
                if blobs:
                    problems.append(
                        f"{label}[{w.uuid}]: inputs {blobs} are safetensors files, which an uploaded "
                        "definition cannot carry (use random, scalar or custom inputs)"
                    )
                if any(i.type == "custom" for i in w.inputs.values()) and not d.custom_inputs_entrypoint:
                    problems.append(f"{label}[{w.uuid}]: custom inputs need the definition's custom_inputs_entrypoint")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def document(self) -> dict[str, object]:
        """The bundle as JSON (a scalar's `shape: null` kept; `workloads_cpu` only when given)."""
        return self.model_dump(mode="json", exclude={"workloads_cpu"} if self.workloads_cpu is None else set())

    @property
    def content_hash(self) -> str:
        """Keyed by content: the same documents give the same hash wherever they come from."""
        doc = self.document()
        return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
