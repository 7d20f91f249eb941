"""SOL-ExecBench formats: valid files load; invalid ones name the field and what was expected."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from worker.catalogue import load_catalogue
from worker.formats import (
    FormatError,
    load_definition,
    load_solution,
    load_workloads,
    solution_from_python_file,
)

CATALOGUE_NAMES = {
    "embedding_backward",
    "embedding_rmsnorm_backward",
    "rmsnorm_forward",
    "rmsnorm_backward",
    "cross_entropy",
}


def _definition(**overrides: object) -> dict:
    d = {
        "name": "toy",
        "axes": {
            "n": {"type": "var"},
            "h": {"type": "const", "value": 8},
            "n2": {"type": "expr", "expression": "n * 2"},
        },
        "inputs": {"x": {"shape": ["n", "h"], "dtype": "bfloat16"}, "eps": {"shape": None, "dtype": "float32"}},
        "outputs": {"y": {"shape": ["n2", "h"], "dtype": "bfloat16"}},
        "reference": "import torch\n\ndef run(x, eps):\n    return torch.cat([x, x])\n",
    }
    d.update(overrides)
    return d


def _write(tmp_path: Path, name: str, data: object) -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


def test_catalogue_has_the_curated_problems_with_exact_signatures() -> None:
    cat = load_catalogue()
    assert set(cat.problems) >= CATALOGUE_NAMES
    assert set(cat.problems) == {
        d.parent.name for d in (cat.get("embedding_backward").folder.parent).glob("*/definition.json")
    }
    emb = cat.get("embedding_backward").definition
    assert list(emb.inputs) == ["indices", "grad_output", "num_embeddings", "padding_idx"]
    assert emb.inputs["num_embeddings"].shape is None and emb.outputs["grad_weight"].dtype == "bfloat16"
    fused = cat.get("embedding_rmsnorm_backward").definition
    assert list(fused.inputs) == ["indices", "weight", "gamma", "grad_output", "eps"]
    assert list(fused.outputs) == ["grad_weight", "grad_gamma"]
    ce = cat.get("cross_entropy").definition
    assert (
        list(ce.outputs) == ["loss", "grad_logits"]
        and ce.outputs["loss"].shape == []
        and ce.outputs["loss"].dtype == "float32"
    )
    assert list(cat.get("rmsnorm_backward").definition.outputs) == ["grad_input", "grad_weight"]
    for p in cat:
        assert p.workloads_cpu and p.workloads_gpu, p.name
        if p.name in CATALOGUE_NAMES:  # curated; the others are audited by the generic path
            assert (p.folder / "audit.json").exists() and (p.folder / "oracle.py").exists()


def test_axes_resolve_const_var_and_expr(tmp_path: Path) -> None:
    d = load_definition(_write(tmp_path, "definition.json", _definition()))
    assert d.resolve_axes({"n": 3}) == {"n": 3, "h": 8, "n2": 6}
    with pytest.raises(ValueError, match="missing values for var axes"):
        d.resolve_axes({})


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"inputs": {"x": {"shape": ["m"], "dtype": "bfloat16"}}}, "inputs.x.shape names axis 'm'"),
        ({"inputs": {"x": {"shape": ["n"], "dtype": "bf16"}}}, "inputs.x.dtype"),
        ({"reference": "def forward(x):\n    return x\n"}, "must define a global function `run`"),
        ({"reference": "def run(:"}, "reference: not valid Python"),
        ({"custom_inputs_entrypoint": "make"}, "custom_inputs_entrypoint: 'make' is not a function"),
        ({"axes": {"n": {"type": "sometimes"}}}, "axes.n"),
        ({"outputs": {"y": {"shape": None, "dtype": "float32"}}}, "outputs must be tensors"),
    ],
)
def test_invalid_definition_names_the_field(tmp_path: Path, overrides: dict, needle: str) -> None:
    with pytest.raises(FormatError) as info:
        load_definition(_write(tmp_path, "definition.json", _definition(**overrides)))
    assert needle in str(info.value)


def _solution(**overrides: object) -> dict:
    s = {
        "name": "s",
        "definition": "toy",
        "author": "a",
        "spec": {"languages": ["pytorch"], "target_hardware": ["LOCAL"], "entry_point": "k.py::run"},
        "sources": [{"path": "k.py", "content": "def run(x, eps, y):\n    pass\n"}],
    }
    s.update(overrides)
    return s


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"spec": {"languages": ["pytorch"], "entry_point": "k.py:run"}}, "spec.entry_point"),
        ({"spec": {"languages": ["pytorch"], "entry_point": "other.py::run"}}, "file 'other.py' is not among sources"),
        ({"spec": {"language": "rust", "entry_point": "k.py::run"}}, "spec.language"),
        ({"sources": [{"path": "../evil.py", "content": ""}]}, "sources.0.path"),
        ({"sources": []}, "sources"),
        ({"name": ""}, "name"),
    ],
)
def test_invalid_solution_names_the_field(tmp_path: Path, overrides: dict, needle: str) -> None:
    with pytest.raises(FormatError) as info:
        load_solution(_write(tmp_path, "solution.json", _solution(**overrides)))
    assert needle in str(info.value)


def test_solution_defaults_to_destination_passing_style(tmp_path: Path) -> None:
    s = load_solution(_write(tmp_path, "solution.json", _solution()))
    assert s.spec.destination_passing_style is True
    assert (s.spec.entry_file, s.spec.entry_function) == ("k.py", "run")


def test_workload_lines_are_validated_with_their_line_number(tmp_path: Path) -> None:
    p = tmp_path / "workload.jsonl"
    good = {
        "uuid": "a",
        "axes": {"n": 4},
        "inputs": {"x": {"type": "random"}, "eps": {"type": "scalar", "value": 1e-6}},
    }
    bad = {"uuid": "b", "axes": {"n": 4}, "inputs": {"x": {"type": "safetensors", "path": "t.safetensors"}}}
    p.write_text(json.dumps(good) + "\n\n" + json.dumps(bad) + "\n")
    with pytest.raises(FormatError) as info:
        load_workloads(p)
    assert f"{p}:3" in str(info.value) and "tensor_key" in str(info.value)
    p.write_text(json.dumps(good) + "\n")
    (w,) = load_workloads(p)
    assert w.inputs["eps"].value == 1e-6  # type: ignore[union-attr]


def _traced(definition: str, workload: dict) -> dict:
    """A workload.jsonl line as SOL-ExecBench's dataset also stores it: a trace carrying only its workload."""
    return {"definition": definition, "workload": workload, "solution": None, "evaluation": None}


def test_workload_lines_may_be_bare_or_wrapped_as_workload_traces(tmp_path: Path) -> None:
    p = tmp_path / "workload.jsonl"
    bare = {"uuid": "a", "axes": {"n": 4}, "inputs": {"x": {"type": "random"}}}
    wrapped = {
        "uuid": "b",
        "axes": {"n": 8},
        "inputs": {"x": {"type": "random"}, "eps": {"type": "scalar", "value": 0.5}},
    }
    p.write_text(json.dumps(bare) + "\n" + json.dumps(_traced("toy", wrapped)) + "\n")
    for named in (None, "toy"):  # the older one-argument call reads it too
        a, b = load_workloads(p, named) if named else load_workloads(p)
        assert (a.uuid, a.axes, b.uuid, b.axes) == ("a", {"n": 4}, "b", {"n": 8})
        assert b.inputs["eps"].value == 0.5  # type: ignore[union-attr]
        assert "definition" not in b.model_dump() and "workload" not in b.model_dump()  # the wrapper is not kept


def test_a_wrapped_workload_of_another_definition_is_refused_with_its_line(tmp_path: Path) -> None:
    p = tmp_path / "workload.jsonl"
    w = {"uuid": "a", "axes": {"n": 4}, "inputs": {"x": {"type": "random"}}}
    p.write_text(json.dumps(w) + "\n" + json.dumps(_traced("other_op", {**w, "uuid": "b"})) + "\n")
    with pytest.raises(FormatError) as info:
        load_workloads(p, "toy")
    assert f"{p}:2" in str(info.value) and "'other_op', not of 'toy'" in str(info.value)
    # without a definition to match, one file's wrapped lines must still agree with each other
    p.write_text(json.dumps(_traced("toy", w)) + "\n" + json.dumps(_traced("other_op", {**w, "uuid": "b"})) + "\n")
    with pytest.raises(FormatError) as info:
        load_workloads(p)
    assert f"{p}:2" in str(info.value) and "line 1's" in str(info.value)
    # the wrapped workload is validated like a bare one, and the error names its line
    p.write_text(
        json.dumps(_traced("toy", {"uuid": "c", "inputs": {"x": {"type": "safetensors", "path": "t.st"}}})) + "\n"
    )
    with pytest.raises(FormatError) as info:
        load_workloads(p, "toy")
    assert f"{p}:1" in str(info.value) and "tensor_key" in str(info.value)
    # a wrapper that names no definition is not a workload trace
    p.write_text(json.dumps({"workload": w, "solution": None}) + "\n")
    with pytest.raises(FormatError, match="definition"):
        load_workloads(p, "toy")


def test_python_file_shorthand(tmp_path: Path) -> None:
    f = tmp_path / "my_kernel.py"
    f.write_text("import triton\n\ndef run(x, eps, y):\n    y.copy_(x)\n")
    s = solution_from_python_file(f, "toy")
    assert s.definition == "toy" and s.spec.languages == ["triton"] and s.spec.entry_point == "my_kernel.py::run"
    assert s.compat_notes == []  # the shorthand writes the official form
    plain = tmp_path / "plain.py"
    plain.write_text("import torch\n\ndef run(x, eps, y):\n    y.copy_(x)\n")
    assert solution_from_python_file(plain, "toy").spec.languages == ["pytorch"]
    with pytest.raises(FormatError, match="cannot read"):
        solution_from_python_file(tmp_path / "missing.py", "toy")


@pytest.mark.parametrize("name", sorted(CATALOGUE_NAMES))
def test_reference_is_within_budget_of_the_oracle(name: str) -> None:
    """Each problem's reference, judged by the probes' own rule (error per group vs fp64, as a multiple of
    the ideal output's), is within the problem's budgets on every CPU workload, with the declared dtypes."""
    import torch

    from worker.inputs import build_case
    from worker.numerics.dtypes import to_torch
    from worker.numerics.error_metrics import measure_output
    from worker.problem_spec import OutputBudget
    from worker.reference import Reference

    p = load_catalogue().get(name)
    ref = Reference.of(p.definition)
    for w in p.workloads_cpu:
        case = build_case(p.definition, ref, w, seed=3)
        outs = ref.run(case.args(p.definition))
        exact = p.oracle()(*case.args(p.definition))
        assert len(outs) == len(exact) == len(p.definition.outputs)
        for (oname, spec), out, ex in zip(p.definition.outputs.items(), outs, exact):
            assert out.dtype == to_torch(spec.dtype) and ex.dtype == torch.float64, oname
            assert tuple(out.shape) == case.output_shapes[oname]
            budget = p.spec.budgets.get(oname, OutputBudget())
            err = measure_output(oname, out, ex, out.dtype, budget)
            assert err.passed, (w.uuid, oname, err.worst_ratio)
