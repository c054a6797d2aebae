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


def _bash_block_after(text: str, heading: str) -> str:
    section = text.split(heading, 1)[1]
    return re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1).strip()


def test_readme_commands_match_ci():
    text = README.read_text()
    ci_lines = (README.parent / ".ci" / "run").read_text().splitlines()
    # CI must run README's test command to the letter, inside a venv it creates itself,
    # or a green CI says nothing about a fresh machine.
    command = _bash_block_after(text, "Run the tests")
    assert command.startswith("pip install torch==2.13.0")
    assert command in ci_lines, f"{command!r} is not a line of .ci/run"
    assert any(line.startswith("python3 -m venv") for line in ci_lines)
