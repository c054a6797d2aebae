"""A griffe extension for the API reference: read ``Example:`` as an ``Examples:`` section.

The kit's docstrings head their doctests ``Example:`` (singular). Griffe's Google-style
parser knows only ``Examples:`` as the section whose ``>>>`` lines render as code; any other
heading becomes an admonition whose body is Markdown, where ``>>>`` reads as a quote and
``x[0]`` as a link. Loaded by ``mkdocs.yml`` (mkdocstrings ``extensions``).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_SINGULAR = re.compile(r"^(\s*)Example:\s*$", re.M)


class ExampleSections(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _SINGULAR.sub(r"\1Examples:", obj.docstring.value)
