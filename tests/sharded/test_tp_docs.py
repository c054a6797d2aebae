"""docs/tp.md runs and prints what it says: blocks after ``<!-- skip: needs a process group``
on both ranks of a real 2-rank gloo world (rank 0's output checked), the others here on a
one-rank mesh. The same conventions as tests/sharded/test_docs.py (its runner is reused)."""

from __future__ import annotations

import pathlib

import pytest

from collectives._harness import world

from .test_docs import _FENCE, _NEEDS_PG, run_blocks

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "tp.md"


def _expected(needs_pg: bool):
    text = DOC.read_text()
    blocks, last = [], 0
    for m in _FENCE.finditer(text):
        before = text[last:m.start()]
        lines = before.rstrip().splitlines()
        blocks.append((m.group(1), m.group(2), bool(lines) and lines[-1].startswith(_NEEDS_PG), before))
        last = m.end()
    codes, checks = [], []
    for i, (lang, code, pg, before) in enumerate(blocks):
        if lang == "python" and pg == needs_pg:
            codes.append((i, code))
        elif lang == "" and codes and codes[-1][0] == i - 1:
            tail = before.strip().splitlines()[-1] if before.strip() else ""
            if tail == ("rank 0 prints" if needs_pg else "prints"):
                checks.append((len(codes) - 1, code))
    return codes, checks


def _check(printed, codes, checks, who):
    for pos, want in checks:
        assert printed[pos] == want, f"tp.md block {codes[pos][0]}: the page says\n{want}\nbut {who} printed\n{printed[pos]}"


def test_tp_page_blocks_in_process():
    codes, checks = _expected(needs_pg=False)
    assert len(codes) >= 2 and len(checks) == len(codes)
    _check(run_blocks(codes), codes, checks, "this process")


@pytest.mark.dist
def test_tp_page_blocks_on_two_ranks():
    codes, checks = _expected(needs_pg=True)
    assert len(codes) >= 1 and len(checks) == len(codes)
    printed = world(2).run(run_blocks, codes, timeout=150.0)[0]
    _check(printed, codes, checks, "rank 0")
