"""Fixtures shared by the engine and catalogue tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from tests.catalogue_support import SandboxPool


@pytest.fixture(scope="module")
def pool() -> Iterator[SandboxPool]:
    """One CPU sandbox child per example solution, for the module."""
    p = SandboxPool("cpu")
    yield p
    p.close()


@pytest.fixture
def one_thread() -> Iterator[None]:
    """The host's matmuls on one thread: with several, they split their sums by thread, so two computations that are
    the same math (a stacked model and its members alone) can differ in the last bit."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
