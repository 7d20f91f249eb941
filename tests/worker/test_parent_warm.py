"""The audit worker's canary warm-up (worker.canary.parent_warm): every site, trusted references only, no trace."""

from __future__ import annotations

import dataclasses

import torch

from worker.canary.binding import SITES
from worker.canary.parent_warm import warm_parent
from worker.catalogue import Catalogue, load_catalogue


def test_every_canary_site_of_the_catalogue_is_trained_and_the_thread_count_is_left_alone() -> None:
    catalogue = load_catalogue()
    before = torch.get_num_threads()
    took = warm_parent(torch.device("cpu"), catalogue, steps=1)
    # the four named in audit.json files, and the newer ones matched from their definitions (worker.canary.matching)
    assert set(took) == set(SITES)
    assert all(s > 0 for s in took.values())
    assert torch.get_num_threads() == before  # the CPU profile trains on one thread; the caller's count comes back
    assert torch.is_grad_enabled()


def test_an_uploaded_reference_is_never_run_in_the_worker() -> None:
    untrusted = {name: dataclasses.replace(p, reference_trusted=False) for name, p in load_catalogue().problems.items()}
    assert warm_parent(torch.device("cpu"), Catalogue(problems=untrusted), steps=1) == {}
