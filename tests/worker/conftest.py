"""Fixtures shared by the engine and catalogue tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.catalogue_support import SandboxPool


@pytest.fixture(scope="module")
def pool() -> Iterator[SandboxPool]:
    """One CPU sandbox child per example solution, for the module."""
    p = SandboxPool("cpu")
    yield p
    p.close()
