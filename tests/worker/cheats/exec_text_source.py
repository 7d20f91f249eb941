"""Cheat: keep the kernel in a source that is not Python and exec it (issue 9: non-.py sources as code).

The solution ships `payload.txt` beside this file; the scan reads only .py
sources, so whatever the text file does (here: the right arithmetic) is never
reviewed.
Caught by: static (dynamic-code and foreign-code: exec of a file's contents). benchmark passes it.
Solution: this file plus payload.txt (the fp32 kernel; its text is in test_cheats.py).
"""

from pathlib import Path

_NS: dict = {}
exec(Path(__file__).with_name("payload.txt").read_text(), _NS)


def run(indices, grad_output, num_embeddings, padding_idx, grad_weight):
    _NS["kernel"](indices, grad_output, padding_idx, grad_weight)
