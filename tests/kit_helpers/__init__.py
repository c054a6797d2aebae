"""Helpers shared by the test suite (a package, not tests: pytest collects nothing here).

pytest puts ``tests/`` on ``sys.path`` (``pythonpath`` in pyproject.toml), in every
``--import-mode``; import from here one way only, by submodule::

    from kit_helpers.compiling import BACKENDS, compile_counted
    from kit_helpers.harness import world

Modules: ``compiling`` (backend axis, counted compiles, comparing results), ``processes``
(fresh interpreters, the CLI), ``harness`` (real gloo worlds), ``docs`` (docs pages whose
blocks run), ``guards_gen`` / ``guards_keys`` (inputs of the guards tests).
"""
