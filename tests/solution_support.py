"""A one-file solution for an uploaded test definition: the kernel's source inline, entry point `k.py::run`."""

from __future__ import annotations

from worker.formats import Solution


def one_file_solution(definition: str, body: str, *, language: str = "pytorch", dps: bool = False) -> Solution:
    return Solution.model_validate(
        {
            "name": "k",
            "definition": definition,
            "spec": {
                "languages": [language],
                "target_hardware": ["LOCAL"],
                "entry_point": "k.py::run",
                "destination_passing_style": dps,
            },
            "sources": [{"path": "k.py", "content": body}],
        }
    )
