"""SOL-ExecBench's own formats, read unchanged: one solution per official language (tests/fixtures/solexecbench),
each parsed, dumped back in the official form, and classified (Python-loaded or compiled C++, CPU or GPU); the
definition's and workloads' official fields; kernel-audit's older `spec.language` read with a compat note; and
source paths that two spellings can reach refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from worker.formats import (
    LANGUAGES,
    FormatError,
    Solution,
    load_definition,
    load_solution,
    load_workloads,
)
from worker.formats.hardware import HARDWARE, device_kinds
from worker.formats.loaders import parse_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "solexecbench"
OFFICIAL = sorted(FIXTURES.glob("solution_*.json"))

# file -> (language family, the languages that need a GPU, whether the spec allows a CPU at all)
EXPECTED: dict[str, tuple[str, list[str]]] = {
    "pytorch": ("python", []),
    "triton": ("python", []),
    "cute_dsl": ("python", ["cute_dsl"]),
    "cutile": ("python", ["cutile"]),
    "cudnn_frontend": ("python", ["cudnn_frontend"]),
    "cuda_cpp": ("cpp", ["cuda_cpp"]),
    "cutlass": ("cpp", ["cutlass"]),
    "cublas": ("cpp", ["cublas"]),
    "cudnn": ("cpp", ["cudnn", "cuda_cpp"]),
}


def _tag(path: Path) -> str:
    return path.stem.removeprefix("solution_")


def _contains(big: Any, small: Any) -> bool:
    """Every key and value of `small` is in `big` (dicts compared key by key, lists and scalars exactly)."""
    if isinstance(small, dict):
        return isinstance(big, dict) and all(k in big and _contains(big[k], v) for k, v in small.items())
    return bool(big == small)


def test_there_is_one_fixture_per_official_language() -> None:
    assert {_tag(p) for p in OFFICIAL} == set(EXPECTED)
    declared = {lang for p in OFFICIAL for lang in json.loads(p.read_text())["spec"]["languages"]}
    assert declared == set(LANGUAGES) and len(LANGUAGES) == 9


@pytest.mark.parametrize("path", OFFICIAL, ids=_tag)
def test_every_official_solution_parses_and_round_trips(path: Path) -> None:
    original = json.loads(path.read_text())
    sol = load_solution(path)
    assert sol.compat_notes == []  # already the official form: nothing to note
    dumped = sol.model_dump(mode="json")
    assert "language" not in dumped["spec"] and "compat_notes" not in dumped and "compat_notes" not in dumped["spec"]
    assert dumped["spec"]["languages"] == original["spec"]["languages"]
    assert _contains(dumped, original), "the dump lost or changed a field of the file"
    again = Solution.model_validate(json.loads(json.dumps(dumped)))
    assert again == sol and again.compat_notes == []


@pytest.mark.parametrize("path", OFFICIAL, ids=_tag)
def test_language_family_and_device_needs(path: Path) -> None:
    spec = load_solution(path).spec
    family, gpu = EXPECTED[_tag(path)]
    assert spec.family == family and spec.is_python is (family == "python") and spec.is_cpp is (family == "cpp")
    assert spec.gpu_languages == gpu and spec.needs_gpu is bool(gpu)
    if family == "cpp":
        assert spec.entry_file.endswith((".cu", ".cpp")) and spec.effective_binding == "torch"
    else:
        assert spec.entry_file == "kernel.py" and spec.effective_binding is None


def test_cpp_specs_carry_what_the_build_needs() -> None:
    cuda = load_solution(FIXTURES / "solution_cuda_cpp.json")
    assert (cuda.spec.entry_file, cuda.spec.entry_function) == ("vecadd.cu", "run")
    assert [s.path for s in cuda.sources] == ["vecadd.cu", "include/vecadd.cuh"]
    opts = cuda.spec.effective_compile_options
    # given cuda_cflags replace the default; the others keep SOL-ExecBench's defaults
    assert (
        opts.cuda_cflags == ["-O3", "--use_fast_math", "-std=c++17"]
        and opts.cflags == []
        and opts.ld_flags == ["-lcuda"]
    )
    cublas = load_solution(FIXTURES / "solution_cublas.json").spec
    assert cublas.binding is None and cublas.effective_binding == "torch"  # null binding means torch for C++
    assert cublas.effective_compile_options.ld_flags == ["-lcublas"] and cublas.dependencies == ["cublas"]
    cutlass = load_solution(FIXTURES / "solution_cutlass.json").spec
    assert cutlass.dependencies == ["CUTLASS_3_7"] and cutlass.entry_point == "main.cpp::run"
    assert cutlass.effective_compile_options.ld_flags == []  # an empty list given is kept, not defaulted
    frontend = load_solution(FIXTURES / "solution_cudnn_frontend.json").spec
    assert frontend.compile_options is None and frontend.pip_packages == ["nvidia-cudnn-frontend"]
    defaults = frontend.effective_compile_options
    assert (defaults.cflags, defaults.cuda_cflags, defaults.ld_flags) == ([], ["-O3", "--use_fast_math"], ["-lcuda"])


def test_compile_options_refuse_unknown_keys(tmp_path: Path) -> None:
    doc = json.loads((FIXTURES / "solution_cuda_cpp.json").read_text())
    doc["spec"]["compile_options"] = {"cuda_flags": ["-O3"]}  # misspelt: the flags would silently vanish
    with pytest.raises(FormatError, match=r"spec\.compile_options\.cuda_flags"):
        parse_model(Solution, doc, "solution.json")


@pytest.mark.parametrize(
    ("hardware", "kinds", "unknown"),
    [
        (["LOCAL"], {"cpu", "cuda"}, []),
        (["local"], {"cpu", "cuda"}, []),
        (["B200"], {"cuda"}, []),
        (["NVIDIA_H100", "H200"], {"cuda"}, []),
        (["cpu"], {"cpu"}, []),
        (["cpu", "cuda"], {"cpu", "cuda"}, []),
        (["B200", "TPUv5"], {"cuda"}, ["TPUv5"]),
        (["sm_90"], set(), ["sm_90"]),  # looked up whole, never by prefix
        (["H100ish"], set(), ["H100ish"]),
    ],
)
def test_target_hardware_table(hardware: list[str], kinds: set[str], unknown: list[str]) -> None:
    assert device_kinds(hardware) == (kinds, unknown)


def test_hardware_table_has_local_and_the_official_gpu() -> None:
    assert HARDWARE["LOCAL"] == {"cpu", "cuda"} and HARDWARE["B200"] == {"cuda"}


def test_older_form_parses_with_a_compat_note() -> None:
    sol = load_solution(FIXTURES / "older_form_solution.json")
    assert sol.spec.languages == ["pytorch"] and sol.spec.family == "python" and not sol.spec.needs_gpu
    (note,) = sol.compat_notes
    assert "spec.language 'python'" in note and "older single-language form" in note and "['pytorch']" in note
    dumped = sol.model_dump(mode="json")
    assert dumped["spec"]["languages"] == ["pytorch"] and "language" not in dumped["spec"]
    assert Solution.model_validate(dumped).compat_notes == []  # the dump is the official form


@pytest.mark.parametrize(
    ("old", "new", "entry"),
    [
        ("python", ["pytorch"], "k.py"),
        ("triton", ["triton"], "k.py"),
        ("cuda", ["cuda_cpp"], "k.cu"),
        ("cpp", ["cuda_cpp"], "k.cpp"),
    ],
)
def test_every_older_language_maps_to_the_official_list(old: str, new: list[str], entry: str) -> None:
    sol = Solution.model_validate(
        {
            "name": "s",
            "definition": "d",
            "spec": {"language": old, "entry_point": f"{entry}::run"},
            "sources": [{"path": entry, "content": "x"}],
        }
    )
    assert sol.spec.languages == new and len(sol.compat_notes) == 1


@pytest.mark.parametrize(
    ("language", "dependencies", "new"),
    [
        # SOL-ExecBench's own earlier samples name a Python solution's GPU DSL only among its dependencies
        ("python", ["torch", "cutlass"], ["cute_dsl"]),
        ("python", ["torch", "cutile"], ["cutile"]),
        ("python", ["torch", "nvidia-cudnn-frontend"], ["cudnn_frontend"]),
        ("python", ["torch", "triton"], ["triton"]),
        ("python", [" CuTile "], ["cutile"]),  # names compared trimmed and lower-cased
        ("python", ["torch"], ["pytorch"]),
        ("python", None, ["pytorch"]),
        ("triton", ["torch", "cutlass"], ["triton"]),  # only a plain Python solution is re-read
    ],
)
def test_an_older_python_solution_takes_its_gpu_dsl_from_its_dependencies(
    language: str, dependencies: Any, new: list[str]
) -> None:
    spec: dict[str, Any] = {"language": language, "entry_point": "kernel.py::run"}
    if dependencies is not None:
        spec["dependencies"] = dependencies
    sol = Solution.model_validate(
        {"name": "s", "definition": "d", "spec": spec, "sources": [{"path": "kernel.py", "content": "x"}]}
    )
    (note,) = sol.compat_notes
    assert sol.spec.languages == new and f"read as spec.languages {new}" in note
    assert sol.spec.needs_gpu == (new[0] not in ("pytorch", "triton"))


def test_notes_cannot_be_supplied_by_the_file() -> None:
    doc = json.loads((FIXTURES / "solution_pytorch.json").read_text())
    doc["compat_notes"] = ["all clear"]
    doc["spec"]["compat_notes"] = ["all clear"]
    sol = Solution.model_validate(doc)
    assert sol.compat_notes == [] and sol.spec.compat_notes == []


def _with_spec(**spec: Any) -> dict[str, Any]:
    doc = json.loads((FIXTURES / "solution_pytorch.json").read_text())
    doc["spec"] = {k: v for k, v in {**doc["spec"], **spec}.items() if v is not None}
    return doc


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        (_with_spec(language="python"), "spec.language: give spec.languages only"),
        (_with_spec(languages=None, language="rust"), "spec.language: 'rust' is not one of the older form's"),
        (
            _with_spec(languages=["pytorch", "cuda_cpp"]),
            "spec.languages: Python-loaded ['pytorch'] and compiled C++ ['cuda_cpp']",
        ),
        (_with_spec(languages=["cuda_cpp"]), "spec.entry_point: languages ['cuda_cpp'] need a C/C++/CUDA file"),
        (_with_spec(languages=["pytorch", "pytorch"]), "names a language twice"),
        (_with_spec(languages=["rust"]), "spec.languages.0"),
        (_with_spec(languages=[]), "spec.languages"),
        (_with_spec(binding="pybind"), "spec.binding"),
        (_with_spec(entry_point="kernel.py:run"), "spec.entry_point"),
    ],
)
def test_invalid_specs_name_the_field(doc: dict[str, Any], needle: str) -> None:
    with pytest.raises(FormatError) as info:
        parse_model(Solution, doc, "solution.json")
    assert needle in str(info.value)


def test_definition_reads_the_official_fields() -> None:
    d = load_definition(FIXTURES / "definition.json")
    assert d.name == "vecadd_f32" and FIXTURES.name != d.name  # the folder is not named after it
    assert d.op_type == "elementwise" and d.tags == ["status:verified", "fixture:kernel-audit"]
    assert d.constraints == ["N >= 1"] and d.custom_inputs_entrypoint == "make_inputs"
    assert {n: a.type for n, a in d.axes.items()} == {"N": "var", "BLOCK": "const", "NUM_BLOCKS": "expr"}
    assert d.inputs["alpha"].is_scalar and d.outputs["c"].shape == ["N"]
    assert d.resolve_axes({"N": 1000}) == {"N": 1000, "BLOCK": 256, "NUM_BLOCKS": 4}


def test_definition_takes_null_for_optional_lists(tmp_path: Path) -> None:
    doc = json.loads((FIXTURES / "definition.json").read_text())
    doc.update(description=None, constraints=None, tags=None, op_type=None)
    p = tmp_path / "definition.json"
    p.write_text(json.dumps(doc))
    d = load_definition(p)
    assert (d.description, d.constraints, d.tags, d.op_type) == ("", [], [], None)


def test_workloads_read_every_input_kind() -> None:
    gpu = {w.uuid: w for w in load_workloads(FIXTURES / "workload.jsonl")}
    kinds = {uuid: {n: i.type for n, i in w.inputs.items()} for uuid, w in gpu.items()}
    assert kinds["vecadd-n4097"] == {"a": "random", "b": "random", "alpha": "scalar"}
    assert kinds["vecadd-n777-custom"] == {"a": "custom", "b": "custom", "alpha": "custom"}
    blob = gpu["vecadd-n8-blob"].inputs["a"]
    assert blob.type == "safetensors" and (blob.path, blob.tensor_key) == ("blobs/vecadd_n8.safetensors", "a")  # type: ignore[union-attr]
    assert gpu["vecadd-n4097"].inputs["alpha"].value == -2.0  # type: ignore[union-attr]
    assert [w.axes for w in load_workloads(FIXTURES / "workload_cpu.jsonl")] == [{"N": 4096}, {"N": 257}]


@pytest.mark.parametrize(
    "path", ["/data/x.safetensors", "../x.safetensors", "blobs/../../x.safetensors", "blobs\\x.safetensors"]
)
def test_safetensors_paths_stay_inside_the_folder(tmp_path: Path, path: str) -> None:
    line = {"uuid": "w", "axes": {"N": 8}, "inputs": {"a": {"type": "safetensors", "path": path, "tensor_key": "a"}}}
    p = tmp_path / "workload.jsonl"
    p.write_text(json.dumps(line) + "\n")
    with pytest.raises(
        FormatError, match=r"inputs\.a\.safetensors\.path: .*relative path inside the definition's folder"
    ):
        load_workloads(p)


@pytest.mark.parametrize("tag, alias", [("trailing_slash", "k.py/"), ("dot_slash", "./k.py")])
def test_malicious_path_alias_is_refused_naming_both_paths(tag: str, alias: str) -> None:
    with pytest.raises(FormatError) as info:
        load_solution(FIXTURES / f"malicious_path_alias_{tag}.json")
    msg = str(info.value)
    assert f"sources.1.path: '{alias}' names the same file ('k.py') as sources.0.path 'k.py'" in msg
    assert "the sandbox would write one over the other" in msg


def _sources(*paths: str) -> dict[str, Any]:
    return {
        "name": "s",
        "definition": "d",
        "spec": {"languages": ["pytorch"], "entry_point": f"{paths[0]}::run"},
        "sources": [{"path": p, "content": "def run():\n    pass\n"} for p in paths],
    }


@pytest.mark.parametrize(
    ("paths", "needle"),
    [
        (("k.py", "k.py"), "sources.1.path: 'k.py' is the same path as sources.0.path 'k.py'"),
        (("pkg/k.py", "pkg//k.py"), "names the same file ('pkg/k.py')"),
        (("pkg/k.py", "pkg/./k.py"), "names the same file ('pkg/k.py')"),
        (("k.py", "k.py/helper.py"), "puts a file inside sources.0.path 'k.py', which is a file"),
        (("k.py", "pkg/"), "sources.1.path: must be a relative path inside the solution: it ends with '/'"),
        (("k.py", "a//b.py"), "has an empty part"),
        (("k.py", "./b.py"), "has a '.' part"),
        (("k.py", "../b.py"), "has a '..' part"),
        (("k.py", "/abs/b.py"), "is absolute"),
        (("k.py", "pkg\\b.py"), "contains '\\'"),
    ],
)
def test_source_paths_have_one_spelling(paths: tuple[str, ...], needle: str) -> None:
    with pytest.raises(FormatError) as info:
        parse_model(Solution, _sources(*paths), "solution.json")
    assert needle in str(info.value)


def test_paths_differing_in_case_are_two_files() -> None:
    sol = Solution.model_validate(_sources("k.py", "K.py", "pkg/k.py"))
    assert [s.path for s in sol.sources] == ["k.py", "K.py", "pkg/k.py"]


def test_entry_file_must_be_canonical_too() -> None:
    with pytest.raises(
        FormatError, match=r"spec\.entry_point: must be a relative path inside the solution: it has a '\.' part"
    ):
        parse_model(
            Solution, {**_sources("k.py"), "spec": {"languages": ["pytorch"], "entry_point": "./k.py::run"}}, "s"
        )


def test_a_custom_scalar_reaches_the_kernel_as_a_number() -> None:
    """make_inputs may return a one-element tensor for a scalar input (shape null); the kernel gets a number, as
    for a workload's own scalar (a Triton kernel given a tensor there reads a pointer and fails to compile)."""
    from worker.inputs import build_case
    from worker.reference import Reference

    d = load_definition(FIXTURES / "definition.json")
    custom = {w.uuid: w for w in load_workloads(FIXTURES / "workload.jsonl")}["vecadd-n777-custom"]
    args = build_case(d, Reference.of(d), custom, seed=1).args(d)
    a, b, alpha = args
    assert isinstance(alpha, float) and alpha == 0.25
    assert a.shape == b.shape == (777,) and b[-1].item() == pytest.approx(776 / 777)
