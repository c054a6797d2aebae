"""Errors raised by ``subclass_kit.testing``.

Each also subclasses the matching builtin, so a test runner that knows nothing about the
kit still reports them properly (``SubclassCheckError`` is an ``AssertionError``).
"""

from __future__ import annotations

from typing import Any

from ..errors import SubclassKitError

__all__ = ["SubclassCheckError", "SamplesError", "CheckTimeout"]


class SubclassCheckError(SubclassKitError, AssertionError):
    """``CheckReport.raise_if_failed()`` found failing checks; the message lists every one.

    ``.report`` holds the whole :class:`~subclass_kit.testing.CheckReport`.
    """

    def __init__(self, message: str, report: Any = None) -> None:
        super().__init__(message)
        self.report = report


class SamplesError(SubclassKitError, TypeError):
    """``check_subclass`` was given something it cannot turn into wrapped-tensor samples."""


class CheckTimeout(BaseException):
    """A check or an op ran past its time limit (see :func:`~subclass_kit.testing.deadline`).

    A ``BaseException`` on purpose: an ``except Exception`` in the code under check must not
    swallow the interruption and keep hanging.
    """

    def __init__(self, message: str, frame_where: str = ""):
        super().__init__(message)
        self.where = frame_where
