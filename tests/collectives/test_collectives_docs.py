"""docs/collectives.md: every python block runs, and what it says it prints, it prints.

Blocks preceded by a ``<!-- skip: needs a process group ... -->`` line run, in order and in
one namespace, on every rank of a real 2-rank gloo world; a plain block introduced by a
line "rank 0 prints" must equal what rank 0 printed. The other blocks run here, without a
process group, in their own namespace; a plain block after "prints" must match them.
"""

from __future__ import annotations

import functools
import pathlib

import pytest
import torch.distributed as dist

from kit_helpers.docs import NEEDS_PG, check_printed, plan, run_blocks
from kit_helpers.harness import run_alone, world

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "collectives.md"


def _expected(needs_pg: bool):
    """[(block index, code)] to run and [(position among them, expected text)] to check."""
    return plan(DOC, NEEDS_PG, marked=needs_pg)


_run = functools.partial(run_blocks, doc_name=DOC.name, module="docs_collectives")


def _run_without_a_process_group(codes):
    assert not dist.is_initialized()
    return _run(codes)


@pytest.mark.dist
def test_blocks_without_a_process_group():
    codes, checks = _expected(needs_pg=False)
    assert len(codes) >= 2 and len(checks) >= 2
    # A fresh process: the page says "no process group", whatever this process has set up.
    printed = run_alone(_run_without_a_process_group, codes)
    check_printed(printed, codes, checks, doc_name=DOC.name, who="a process without a group")


@pytest.mark.dist
def test_blocks_on_two_ranks():
    codes, checks = _expected(needs_pg=True)
    assert len(codes) >= 3 and len(checks) >= 3
    printed = world(2).run(_run, codes)[0]
    check_printed(printed, codes, checks, doc_name=DOC.name, who="rank 0")
