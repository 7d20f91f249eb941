"""Sources may read only the solution's files and the toolchain's headers: host files named by path, '..' out of
the solution, and includes the scan cannot check are refused before compiling; the compiler's own depfiles are
checked after."""

from __future__ import annotations

import pytest

from worker.build.includes import check_dependencies, check_includes, parse_depfile
from worker.build.request import BuildSource


def scan(content: str, path: str = "k.cu", extra: dict[str, str] | None = None) -> list[str]:
    sources = [BuildSource(path=path, content=content)] + [
        BuildSource(path=p, content=c) for p, c in (extra or {}).items()
    ]
    return [f"{r.flag} -> {r.reason}" for r in check_includes(sources)]


@pytest.mark.parametrize(
    "content",
    [
        '#include "/etc/passwd"\n',
        "#include </proc/self/environ>\n",
        '#include "../../x"\n',
        "#include <../../../etc/shadow>\n",
        '#include_next "/etc/hostname"\n',
        '#import "/etc/passwd"\n',
        '#embed "/etc/passwd"\n',
        '#pragma GCC dependency "/etc/passwd"\n',
        "#define HOSTILE </etc/passwd>\n#include HOSTILE\n",  # a computed include
        '  #  include   "/etc/passwd"\n',  # spaces anywhere
        '# /* a comment */ include "/etc/passwd"\n',  # a comment between '#' and the keyword
        '/* a comment\n   over lines */ #include "/etc/passwd"\n',  # a directive after a multi-line comment
        '#inc\\\nlude "/etc/passwd"\n',  # a line splice inside the keyword
        '??=include "/etc/passwd"\n',  # a trigraph '#' (-std=c++14)
        '%:include "/etc/passwd"\n',  # a digraph '#'
        'const char* s = "/*";\n#include "/etc/passwd"\nconst char* t = "*/";\n',  # a fake comment from strings
        "int x = 1'000; char c = '/*';\n#include \"/etc/passwd\"\n// */\n",  # digit separators against a lexer
        '#if __has_include("/etc/passwd")\n#endif\n',
        'asm(".incbin \\"/etc/passwd\\"");\n',
    ],
)
def test_reading_a_host_file_or_climbing_out_is_refused(content: str) -> None:
    assert scan(content), content


def test_the_refusal_names_file_line_and_reason() -> None:
    (found,) = scan('int a;\n#include "/etc/passwd"\n')
    assert found.startswith('k.cu:2: #include "/etc/passwd" -> an absolute path')


@pytest.mark.parametrize(
    ("content", "path", "extra"),
    [
        (
            "#include <torch/extension.h>\n#include <cuda_runtime.h>\n#include <cutlass/gemm/device/gemm.h>\n",
            "k.cu",
            None,
        ),
        ('#include "kernel.cuh"\n#include "detail/util.h"\n', "k.cu", None),
        ('#include "../common.h"\n', "sub/k.cu", {"common.h": "int x;\n"}),  # '..' onto the solution's own file
        ("// #include </etc/passwd>  a line comment is not a directive\n", "k.cu", None),
        ('printf("#include </etc/passwd>");\n', "k.cu", None),  # a string mid-line
        ("#ifndef K_H\n#define K_H\n#pragma once\n#endif\n", "k.cu", None),
    ],
)
def test_ordinary_includes_pass(content: str, path: str, extra: dict[str, str] | None) -> None:
    assert scan(content, path, extra) == []


def test_dotdot_onto_a_file_the_solution_lacks_is_refused() -> None:
    assert scan('#include "../common.h"\n', "sub/k.cu")


def test_depfile_lists_what_the_compile_read_and_outside_files_are_refused() -> None:
    depfile = (
        "0_k.o: /tmp/work/b/src/k.cpp /tmp/work/b/src/k.h \\\n /usr/include/stdio.h \\\n"
        " /venv/torch/include/torch/extension.h /proc/self/environ \\\n"
        " /usr/local/cuda/bin/../targets/x86_64-linux/include/cuda_runtime.h /etc/pass\\ wd\n"
    )
    deps = parse_depfile(depfile)
    assert "/etc/pass wd" in deps and "/proc/self/environ" in deps and len(deps) == 7
    found = check_dependencies(deps, "/tmp/work/b/src", ["/usr/include", "/venv/torch/include", "/usr/local/cuda"])
    assert [r.flag for r in found] == ["/proc/self/environ", "/etc/pass wd"]
    assert check_dependencies(["/tmp/work/b/src/../../../etc/passwd"], "/tmp/work/b/src", ["/usr/include"])
