"""The docs site builds with ``mkdocs build --strict`` (broken links, pages missing from the
nav and docstring warnings fail it), and the API reference is generated from the docstrings."""

import inspect
import os
import pathlib
import subprocess
import sys

import subclass_kit

REPO = pathlib.Path(__file__).resolve().parent.parent


def test_mkdocs_build_strict(tmp_path):
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"), "-d", str(site)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"

    api = (site / "api" / "subclass_kit" / "index.html").read_text()
    assert 'id="subclass_kit.WrapperTensor"' in api
    # Docstring text, not just the name: the reference is generated from the source.
    summary = inspect.getdoc(subclass_kit.WrapperTensor).splitlines()[0]
    assert summary in api
    for page, anchor in [
        ("symbolic", "symbolic.mark_dynamic"),
        ("guards", "guards.explain_recompiles"),
        ("collectives", "subclass_kit.collectives.AsyncCollectiveTensor"),
        ("sharded", "subclass_kit.sharded.ShardedTensor"),
        ("testing", "subclass_kit.testing.check_subclass"),
    ]:
        assert f'id="{anchor}"' in (site / "api" / page / "index.html").read_text(), anchor

    # "Example:" doctests render as code blocks, not as Markdown (where ">>>" is a quote).
    guards_page = (site / "api" / "guards" / "index.html").read_text()
    explain = guards_page.split('id="guards.GuardSet.explain"', 1)[1].split('id="guards.GuardSet.describe"', 1)[0]
    assert "<blockquote>" not in explain and "<code>" in explain

    changelog = (site / "changelog" / "index.html").read_text()
    assert "Unreleased" in changelog and "0.1.0" in changelog
    # The hand-written guides are all there, their executed examples as code.
    for md in sorted((REPO / "docs").glob("*.md")):
        page = site / ("index.html" if md.stem == "index" else f"{md.stem}/index.html")
        assert page.exists(), f"{md.name} was not built"
