"""Cheat: import a module from a data file through importlib (issue 9: importlib on a data file).

`helper.txt` is Python under another name; SourceFileLoader runs it whatever
its extension, and the scan never reads it.
Caught by: static (foreign-code: spec_from_file_location / SourceFileLoader). benchmark passes it.
Solution: this file plus helper.txt (the fp32 kernel; its text is in test_cheats.py).
"""

import importlib.machinery
import importlib.util
from pathlib import Path

_PATH = str(Path(__file__).with_name("helper.txt"))
_LOADER = importlib.machinery.SourceFileLoader("kernel_helper", _PATH)
_SPEC = importlib.util.spec_from_file_location("kernel_helper", _PATH, loader=_LOADER)
_HELPER = importlib.util.module_from_spec(_SPEC)
_LOADER.exec_module(_HELPER)


def run(indices, grad_output, num_embeddings, padding_idx, grad_weight):
    _HELPER.kernel(indices, grad_output, padding_idx, grad_weight)
