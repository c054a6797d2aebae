"""What a check family is made of: :class:`Check` rows planned from a :class:`Run`, and the
:class:`Skip` / :class:`Fail` outcomes a check raises.

Family modules (``protocol``, ``eager``, ``compiled``, ...) import these from here and
``runner`` imports the families: the imports point one way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ._subject import Subject

__all__ = ["Check", "Fail", "Skip", "Run", "selected"]


class Skip(Exception):
    """The check does not apply (the reason says why)."""


class Fail(Exception):
    """The check failed: ``what`` is wrong, ``fix`` says how to repair it."""

    def __init__(self, what: str, fix: str = ""):
        self.what, self.fix = what.rstrip(), fix.rstrip()
        super().__init__(self.message)

    @property
    def message(self) -> str:
        what = self.what if self.what.endswith((".", ")", "?")) else self.what + "."
        return f"{what} Fix: {self.fix}" if self.fix else what


@dataclass(frozen=True)
class Check:
    name: str
    fn: Callable
    requires: tuple = ()
    late: bool = False  # run after all others (e.g. it waits for a child process)


@dataclass
class Run:
    """Everything a check may read: the subject, the options, and results of earlier checks."""

    subject: Subject
    cases: list
    backends: tuple
    dynamic: bool
    backward: bool
    export: bool
    serialization: bool
    only: tuple = ()
    aoti: bool = False  # opt-in AOTInductor row (slow)
    opinfo: object = False  # opt-in OpInfo sweep: True (every op) or op names
    timeout: float | None = None  # seconds per row (None: no limit)
    status: dict = field(default_factory=dict)  # check name -> status
    passed_cases: list = field(default_factory=list)  # OpCases that passed eager
    state: dict = field(default_factory=dict)  # free-form, per family

    @property
    def cls(self):
        return self.subject.cls

    @property
    def name(self) -> str:
        return self.subject.name

    @property
    def samples(self) -> list:
        return self.subject.samples

    @property
    def first(self):
        return self.subject.samples[0]

    def compile_cases(self) -> list:
        """The ops to compile: deterministic ones that passed their eager rows; when the
        eager rows were not selected, those that run on the first sample without raising."""
        if any(k.startswith("eager[") for k in self.status):
            return [c for c in self.passed_cases if c.deterministic]
        if "probed" not in self.state:
            ok = []
            for c in self.cases:
                if not c.deterministic or not c.applies(self.first):
                    continue
                try:
                    c.call(self.first)
                except Exception:
                    continue
                ok.append(c)
            self.state["probed"] = ok
        return list(self.state["probed"])

    def compile_backend(self) -> str:
        """The backend for the extra compile checks (dynamic, meta change, backward):
        ``aot_eager`` when selected (it runs AOTAutograd, cheaply), else the first one;
        ``"none"`` when no backend is selected (those checks then skip)."""
        if "aot_eager" in self.backends:
            return "aot_eager"
        return self.backends[0] if self.backends else "none"


def selected(name: str, only) -> bool:
    """True when ``only`` (names or prefixes; empty = all) selects the check ``name``."""
    if not only:
        return True
    return any(name.startswith(o) for o in only)
