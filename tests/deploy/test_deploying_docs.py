"""docs/deploying.md runs and prints what it says.

Blocks preceded by ``<!-- ranks: ...`` run, in order and in one namespace, on every rank of
a real 2-rank gloo world (a plain block introduced by "rank 0 prints" must equal what rank 0
printed); the other blocks run here, in order, in one namespace (a plain block after
"prints" must match). Slow: each half compiles AOTInductor packages.
"""

from __future__ import annotations

import contextlib
import io
import pathlib
import re

import pytest

from collectives._harness import world

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "deploying.md"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.M | re.S)
_RANKS = "<!-- ranks:"

pytestmark = pytest.mark.slow


def _blocks():
    text = DOC.read_text()
    out, last = [], 0
    for m in _FENCE.finditer(text):
        before = text[last : m.start()]
        lines = before.rstrip().splitlines()
        out.append((m.group(1), m.group(2), bool(lines) and lines[-1].startswith(_RANKS), before))
        last = m.end()
    return out


def run_blocks(codes) -> list:
    """Exec the blocks in one namespace; what each printed (module-level: runs on ranks)."""
    ns = {"__name__": "docs_deploying"}
    printed = []
    for i, code in codes:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            exec(compile(code, f"{DOC.name}[python block {i}]", "exec"), ns)
        printed.append(buf.getvalue())
    return printed


def _plan(on_ranks: bool):
    codes, checks = [], []
    for i, (lang, code, ranks, before) in enumerate(_blocks()):
        if lang == "python" and ranks == on_ranks:
            codes.append((i, code))
        elif lang == "" and codes and codes[-1][0] == i - 1:
            last = before.strip().splitlines()[-1] if before.strip() else ""
            if last == ("rank 0 prints" if on_ranks else "prints"):
                checks.append((len(codes) - 1, code))
    return codes, checks


def test_page_has_both_kinds_of_blocks():
    local, local_checks = _plan(False)
    ranked, ranked_checks = _plan(True)
    assert len(local) >= 6 and len(ranked) >= 2
    assert len(local_checks) >= 2 and len(ranked_checks) >= 1


def test_local_recipes_run_and_print_what_the_page_says():
    codes, checks = _plan(False)
    printed = run_blocks(codes)
    for idx, expected in checks:
        assert printed[idx] == expected, (codes[idx][0], printed[idx], expected)


@pytest.mark.dist
def test_rank_recipes_run_on_two_ranks():
    codes, checks = _plan(True)
    printed = world(2).run(run_blocks, codes, timeout=600)
    for idx, expected in checks:
        assert printed[0][idx] == expected, (codes[idx][0], printed[0][idx], expected)
