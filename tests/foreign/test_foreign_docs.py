"""docs/foreign.md runs as written: every ```python block in order in one namespace; a plain
block introduced by a line ending in "prints" must equal what the block before printed."""

import contextlib
import io
import pathlib
import re
import sys
import types

import pytest

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "foreign.md"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.M | re.S)


@pytest.mark.dist  # the DTensor block makes a one-rank gloo group on 127.0.0.1
def test_doc_python_blocks_run_and_print_what_the_page_says():
    # a real module, so that torch.compile can find the page's functions' globals
    mod = types.ModuleType("docs_foreign")
    sys.modules["docs_foreign"] = mod
    printed, checked, last = None, 0, 0
    text = DOC.read_text()
    try:
        for i, m in enumerate(_FENCE.finditer(text)):
            lang, code, before = m.group(1), m.group(2), text[last:m.start()]
            last = m.end()
            if lang == "python":
                buf = io.StringIO()
                with contextlib.redirect_stdout(buf):
                    exec(compile(code, f"{DOC.name}[block {i}]", "exec"), mod.__dict__)
                printed = buf.getvalue()
            elif lang == "" and before.strip().endswith("prints"):
                assert printed == code, f"block {i}: the page says\n{code}\nbut the code printed\n{printed}"
                checked += 1
    finally:
        del sys.modules["docs_foreign"]
    assert checked == 6
