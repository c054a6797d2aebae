"""docs/tp.md runs and prints what it says: blocks after ``<!-- skip: needs a process group``
on both ranks of a real 2-rank gloo world (rank 0's output checked), the others here on a
one-rank mesh. The same conventions as tests/sharded/test_docs.py (kit_helpers.docs)."""

from __future__ import annotations

import functools
import pathlib

import pytest

from kit_helpers.docs import NEEDS_PG, check_printed, plan, run_blocks
from kit_helpers.harness import world

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "tp.md"


def _expected(needs_pg: bool):
    return plan(DOC, NEEDS_PG, marked=needs_pg)


_run = functools.partial(run_blocks, doc_name=DOC.name, module="docs_sharded")


def test_tp_page_blocks_in_process():
    codes, checks = _expected(needs_pg=False)
    assert len(codes) >= 2 and len(checks) == len(codes)
    check_printed(_run(codes), codes, checks, doc_name=DOC.name, who="this process")


@pytest.mark.dist
def test_tp_page_blocks_on_two_ranks():
    codes, checks = _expected(needs_pg=True)
    assert len(codes) >= 1 and len(checks) == len(codes)
    printed = world(2).run(_run, codes, timeout=150.0)[0]
    check_printed(printed, codes, checks, doc_name=DOC.name, who="rank 0")
