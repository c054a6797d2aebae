"""docs/deploying.md runs and prints what it says.

Blocks preceded by ``<!-- ranks: ...`` run, in order and in one namespace, on every rank of
a real 2-rank gloo world (a plain block introduced by "rank 0 prints" must equal what rank 0
printed); the other blocks run here, in order, in one namespace (a plain block after
"prints" must match). Slow: each half compiles AOTInductor packages.
"""

from __future__ import annotations

import functools
import pathlib

import pytest

from kit_helpers.docs import check_printed, plan, run_blocks
from kit_helpers.harness import world

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "deploying.md"
_RANKS = "<!-- ranks:"

pytestmark = pytest.mark.slow


def _plan(on_ranks: bool):
    return plan(DOC, _RANKS, marked=on_ranks)


_run = functools.partial(run_blocks, doc_name=DOC.name, module="docs_deploying")


def test_page_has_both_kinds_of_blocks():
    local, local_checks = _plan(False)
    ranked, ranked_checks = _plan(True)
    assert len(local) >= 6 and len(ranked) >= 2
    assert len(local_checks) >= 2 and len(ranked_checks) >= 1


def test_local_recipes_run_and_print_what_the_page_says():
    codes, checks = _plan(False)
    check_printed(_run(codes), codes, checks, doc_name=DOC.name, who="this process")


@pytest.mark.dist
def test_rank_recipes_run_on_two_ranks():
    codes, checks = _plan(True)
    printed = world(2).run(_run, codes, timeout=600)[0]
    check_printed(printed, codes, checks, doc_name=DOC.name, who="rank 0")
