"""The README's Python example runs as written."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README lost its example"
    ns: dict = {"__name__": "readme_example"}
    for code in blocks:
        exec(compile(code, str(README), "exec"), ns)
    # The example ends in an assert against the dense reference; check it really ran.
    assert "y" in ns and ns["y"].shape == (64, 8)


def test_readme_commands_match_ci():
    text = README.read_text()
    ci = (README.parent / ".ci" / "run").read_text()
    assert "pip install torch==2.13.0" in text and "torch==2.13.0" in ci
    assert "python -m pytest -q -p no:cacheprovider" in text
    assert "python -m pytest -q -p no:cacheprovider" in ci
