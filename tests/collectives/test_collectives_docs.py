"""docs/collectives.md: every python block runs, and what it says it prints, it prints.

Blocks preceded by a ``<!-- skip: needs a process group ... -->`` line run, in order and in
one namespace, on every rank of a real 2-rank gloo world; a plain block introduced by a
line "rank 0 prints" must equal what rank 0 printed. The other blocks run here, without a
process group, in their own namespace; a plain block after "prints" must match them.
"""

from __future__ import annotations

import contextlib
import io
import pathlib
import re

import pytest
import torch.distributed as dist

from ._harness import run_alone, world

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "collectives.md"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.M | re.S)
_NEEDS_PG = "<!-- skip: needs a process group"


def _blocks():
    """(language, code, needs_pg, the text just before the fence) for each fenced block."""
    text = DOC.read_text()
    out, last = [], 0
    for m in _FENCE.finditer(text):
        before = text[last:m.start()]
        needs_pg = before.rstrip().splitlines()[-1].startswith(_NEEDS_PG) if before.strip() else False
        out.append((m.group(1), m.group(2), needs_pg, before))
        last = m.end()
    return out


def _run(codes) -> list:
    ns = {"__name__": "docs_collectives"}
    printed = []
    for i, code in codes:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            exec(compile(code, f"{DOC.name}[python block {i}]", "exec"), ns)
        printed.append(buf.getvalue())
    return printed


def _expected(needs_pg: bool):
    """[(block index, code)] to run and [(position among them, expected text)] to check."""
    codes, checks = [], []
    blocks = _blocks()
    for i, (lang, code, pg, before) in enumerate(blocks):
        if lang == "python" and pg == needs_pg:
            codes.append((i, code))
        elif lang == "" and codes and codes[-1][0] == i - 1:
            last = before.strip().splitlines()[-1] if before.strip() else ""
            if last == ("rank 0 prints" if needs_pg else "prints"):
                checks.append((len(codes) - 1, code))
    return codes, checks


def _run_without_a_process_group(codes):
    assert not dist.is_initialized()
    return _run(codes)


@pytest.mark.dist
def test_blocks_without_a_process_group():
    codes, checks = _expected(needs_pg=False)
    assert len(codes) >= 2 and len(checks) >= 2
    # A fresh process: the page says "no process group", whatever this process has set up.
    printed = run_alone(_run_without_a_process_group, codes)
    for pos, want in checks:
        assert printed[pos] == want, f"block {codes[pos][0]}: the page says\n{want}\nbut it printed\n{printed[pos]}"


@pytest.mark.dist
def test_blocks_on_two_ranks():
    codes, checks = _expected(needs_pg=True)
    assert len(codes) >= 3 and len(checks) >= 3
    printed = world(2).run(_run, codes)[0]
    for pos, want in checks:
        assert printed[pos] == want, f"block {codes[pos][0]}: the page says\n{want}\nbut rank 0 printed\n{printed[pos]}"
