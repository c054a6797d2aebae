"""``subclass_kit.__version__`` is the installed distribution's version, which is pyproject's."""

import importlib.metadata
import pathlib
import re

import subclass_kit

PYPROJECT = pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_version_is_the_distribution_version():
    # (tomllib is 3.11+; the package supports 3.10)
    declared = re.search(r'^version = "([^"]+)"', PYPROJECT.read_text(), re.M).group(1)
    assert subclass_kit.__version__ == importlib.metadata.version("subclass-kit") == declared


def test_changelog_has_the_version():
    changelog = (PYPROJECT.parent / "CHANGELOG.md").read_text()
    assert f"## [{subclass_kit.__version__}]" in changelog
