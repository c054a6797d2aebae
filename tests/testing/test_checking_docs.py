"""docs/checking.md: every python block runs, in order, in one namespace (the page says so)."""

from __future__ import annotations

import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "checking.md"
_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def _blocks():
    return [(lang, code) for lang, code in _BLOCK.findall(DOC.read_text())]


def test_page_has_python_and_cli_blocks():
    langs = [lang for lang, _ in _blocks()]
    assert langs.count("python") >= 6 and "text" in langs


def test_python_blocks_run_in_order(capsys):
    ns = {"__name__": "checking_doc"}
    for i, (lang, code) in enumerate(_blocks()):
        if lang != "python":
            continue
        try:
            exec(compile(code, f"{DOC.name}[block {i}]", "exec"), ns)
        except Exception as e:  # name the block that broke
            pytest.fail(f"block {i} of {DOC.name} raised {type(e).__name__}: {e}\n{code}")
    out = capsys.readouterr().out
    # What the page says these blocks print.
    assert "pass - ctx change recompiled (2 frames) and matched eager" in out
    assert "TwoTensor lacks to_plain" in out
    assert "outer_stride was ignored" in out and "Fix: build the wrapper from the outer_size and outer_stride" in out
