"""docs/symbolic.md: every ```python block runs, in order, in one namespace.

A plain ``` block introduced by a line "prints" must equal what the python block before it
printed, so the page cannot drift from what the code says.
"""

import contextlib
import io
import pathlib
import re

import torch

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "symbolic.md"

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.M | re.S)


def blocks(text):
    """(language, code, the text just before the fence) for each fenced block."""
    out, last = [], 0
    for m in _FENCE.finditer(text):
        out.append((m.group(1), m.group(2), text[last:m.start()]))
        last = m.end()
    return out


def test_doc_has_python_blocks():
    langs = [lang for lang, _, _ in blocks(DOC.read_text())]
    assert langs.count("python") >= 10


def test_python_blocks_run_in_order():
    ns = {"__name__": "docs_symbolic"}
    printed = None
    checked_prints = 0
    for i, (lang, code, before) in enumerate(blocks(DOC.read_text())):
        if lang == "python":
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                try:
                    exec(compile(code, f"{DOC.name}[python block {i}]", "exec"), ns)
                finally:
                    torch._dynamo.reset()
            printed = buf.getvalue()
        elif lang == "" and before.strip().endswith("prints"):
            assert printed == code, f"block {i}: the page says\n{code}\nbut the code printed\n{printed}"
            checked_prints += 1
    assert checked_prints >= 3
