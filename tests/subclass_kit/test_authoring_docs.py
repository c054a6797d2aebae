"""docs/authoring.md: every ```python block runs, in order, in one namespace.

The namespace is a registered module, so classes defined on the page pickle and are not
"local" (no LocalClassWarning), exactly as in a user's own module. A plain ``` block
introduced by a line ending in "prints" must equal what the python block before it printed.
"""

from __future__ import annotations

import contextlib
import io
import pathlib
import re
import sys
import types

import pytest

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "authoring.md"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.M | re.S)


def blocks(text):
    """(language, code, the text since the previous fence) for each fenced block."""
    out, last = [], 0
    for m in _FENCE.finditer(text):
        out.append((m.group(1), m.group(2), text[last : m.start()]))
        last = m.end()
    return out


@pytest.fixture
def doc_module():
    mod = types.ModuleType("docs_authoring")
    sys.modules[mod.__name__] = mod
    try:
        yield mod
    finally:
        del sys.modules[mod.__name__]


def test_doc_has_python_blocks_and_checked_output():
    langs = [lang for lang, _, _ in blocks(DOC.read_text())]
    assert langs.count("python") >= 12


def test_python_blocks_run_in_order(doc_module):
    ns = doc_module.__dict__
    printed, checked = None, 0
    for i, (lang, code, before) in enumerate(blocks(DOC.read_text())):
        if lang == "python":
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                exec(compile(code, f"{DOC.name}[python block {i}]", "exec"), ns)
            printed = buf.getvalue()
        elif lang == "" and before.strip().endswith("prints"):
            assert printed == code, f"block {i}: the page says\n{code}\nbut the code printed\n{printed}"
            checked += 1
    assert checked >= 8
    # The page's classes behave like a user's module-level classes.
    assert ns["BlockScaled"].__module__ == "docs_authoring"
