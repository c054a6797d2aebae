"""The compile boundary's direct call: a compiled body's dynamo artifact, run without dynamo's
frame entry.

A ``torch.compile``'d function pays on every call for its wrapper (eval-frame callback on and
off, stance, tracing-state checks), for the eval-frame hook's cache lookup, and for running
every Python frame under the callback. After dynamo compiled a body, what it does on a hit is:
check the entry's guards on the frame's locals, then run the entry's transformed code. The
boundary does exactly that itself, with dynamo's own C++ guard tree (so nothing the trace read
goes unguarded) and dynamo's own code, as long as

* no dynamo callback is active, the stance is the default and no guard-complete hook is set
  (guard collectives: ``_compat.dynamo_idle``),
* dynamo still holds the artifact (``torch._dynamo.reset()`` drops it), and
* the transformed code does nothing a callback would have to see: it loads only the compiled
  graphs, dynamo's bytecode hooks and module dicts, and calls nothing else (no graph break's
  resume function, no user function left to run eagerly). Anything else keeps dynamo's path.

A guard miss goes through dynamo (which recompiles or runs eagerly as it would), and the
artifacts are read again when dynamo's entry count changed.
"""

from __future__ import annotations

import dis
import types
from typing import Any, Callable

import torch

from . import _compat

__all__ = ["Direct", "direct_runs", "through_dynamo"]

# Stack shuffling, local and container bytecode: what dynamo's transformed code is made of
# around the graph call (Python 3.10-3.13 spellings). An opcode outside this set keeps the
# entry on dynamo's own path.
_PLAIN_OPS = frozenset({
    "RESUME", "NOP", "CACHE", "EXTENDED_ARG", "PUSH_NULL", "PRECALL", "CALL", "KW_NAMES", "COPY", "SWAP",
    "ROT_TWO", "ROT_THREE", "ROT_FOUR", "ROT_N", "DUP_TOP", "POP_TOP", "LOAD_FAST", "LOAD_FAST_CHECK",
    "LOAD_FAST_AND_CLEAR", "LOAD_FAST_LOAD_FAST", "LOAD_FAST_BORROW", "LOAD_FAST_BORROW_LOAD_FAST_BORROW",
    "STORE_FAST", "STORE_FAST_STORE_FAST", "STORE_FAST_LOAD_FAST", "DELETE_FAST", "LOAD_CONST", "LOAD_SMALL_INT",
    "RETURN_VALUE", "RETURN_CONST", "BINARY_SUBSCR", "BUILD_LIST", "BUILD_TUPLE", "BUILD_MAP",
    "BUILD_CONST_KEY_MAP", "LIST_EXTEND", "LIST_APPEND", "LIST_TO_TUPLE", "UNPACK_SEQUENCE",
    "CALL_FUNCTION", "CALL_METHOD", "LOAD_GLOBAL", "LOAD_ATTR", "LOAD_METHOD",
})
_CALLS = frozenset({"CALL", "CALL_FUNCTION", "CALL_METHOD"})
# Attributes the code may call: dynamo's pre-graph hooks, ``builtins.type``, and the
# accessors of ``torch._dynamo.utils`` that hand a graph with dynamic shapes its symbolic
# sizes (``x.size(i)``: nothing a callback would see).
_HOOKS = frozenset({"record_pregraph_bytecode_enter", "record_pregraph_bytecode_exit", "type",
                    "call_size", "call_stride", "call_storage_offset"})
# Attributes it may read: a module's own dicts; a class's dict, a property's getter and its
# closure cells (how dynamo reaches a twin's child: ``type(m).__dict__[k].fget.__closure__``).
_READS = frozenset({"_modules", "_parameters", "_buffers", "__dict__", "fget", "__closure__", "cell_contents"})
# Methods the code may call: restoring a module's parameter dict (functional_call's replay).
_DICT_METHODS = frozenset({"update", "clear"})
_MODULES = frozenset({"__import_torch_dot__dynamo_dot_utils", "__import_builtins"})
_GRAPH = "__compiled_fn_"
_SCOPE = "___unnamed_scope_"  # a traced function's globals, as dynamo names them


def _plain(code: types.CodeType, ns: dict) -> bool:
    """True when ``code`` only shuffles values, reads module and class dicts and calls compiled
    graphs, dynamo's hooks, ``type`` and dict methods (counted: every call has one of those
    as its callee)."""
    if code.co_freevars or code.co_cellvars:
        return False
    if any(isinstance(c, types.CodeType) or callable(c) for c in code.co_consts):
        return False
    callees = calls = 0
    ins_list = list(dis.get_instructions(code))
    # Locals that hold an allowed callee (dynamo keeps ``call_size`` in a temporary and calls
    # it once per symbolic size): stored right after the callee's load by ``COPY 1;
    # STORE_FAST``, and never stored otherwise.
    aliases: set = set()
    alias_stores: set = set()
    for k, ins in enumerate(ins_list):
        op, name = ins.opname, ins.argval
        if op not in _PLAIN_OPS:
            return False
        if op in _CALLS:
            calls += 1
        elif op == "LOAD_FAST" and name in aliases:
            callees += 1
        elif op == "STORE_FAST" and name in aliases and k not in alias_stores:
            return False
        elif op == "LOAD_GLOBAL":
            if name.startswith(_GRAPH):
                callees += 1
            elif not (name in _MODULES or isinstance(ns.get(name), torch.nn.Module)
                      or (name.startswith(_SCOPE) and type(ns.get(name)) is dict)):
                return False
        elif op == "LOAD_ATTR" or op == "LOAD_METHOD":
            if name in _HOOKS or (name in _DICT_METHODS and op == "LOAD_METHOD"):
                callees += 1
                nxt = ins_list[k + 1:k + 3]
                if len(nxt) == 2 and (nxt[0].opname, nxt[0].arg, nxt[1].opname) == ("COPY", 1, "STORE_FAST"):
                    if any(i.opname == "STORE_FAST" and i.argval == nxt[1].argval for i in ins_list[:k]):
                        return False  # the local held something else before
                    aliases.add(nxt[1].argval)
                    alias_stores.add(k + 2)
            elif name not in _READS:
                return False
    return calls <= callees


def _runner(code: types.CodeType, ns: dict) -> Callable:
    # The graphs' ``disable`` wrappers only switch a callback off that is not on here.
    g = dict(ns)
    for k, v in ns.items():
        if k.startswith(_GRAPH):
            inner = _compat.dynamo_disabled_inner(v)
            if inner is not None:
                g[k] = inner
    return types.FunctionType(code, g, code.co_name)


class Direct:
    """One compiled body's artifacts, to run directly: ``runs`` is a tuple of
    ``(guard_check, run)`` in dynamo's order; ``count`` how many entries dynamo had."""

    __slots__ = ("runs", "count", "codes")

    def __init__(self, runs: tuple, count: int, codes: tuple) -> None:
        self.runs = runs
        self.count = count
        self.codes = codes

    def live(self, live_codes: set) -> bool:
        """Every artifact still held by dynamo (not dropped by ``torch._dynamo.reset()``)."""
        return all(c in live_codes for c in self.codes)


def direct_runs(compiled: Any, old: "Direct | None" = None) -> "Direct | None":
    """The direct runs of ``compiled`` (a ``torch.compile``'d body), re-read only when dynamo's
    entries changed since ``old``; an empty ``runs`` when any entry must keep dynamo's path
    (dynamo's guards are tried in its order, so one entry that cannot run directly would
    change which entry serves)."""
    arts = _compat.dynamo_artifacts(compiled)
    if old is not None and old.count == len(arts) and old.live(_compat.dynamo_live_codes()):
        return old
    runs: list = []
    for check, code, ns in arts:
        if not _plain(code, ns):
            runs = []
            break
        runs.append((check, _runner(code, ns)))
    return Direct(tuple(runs), len(arts), tuple(id(code) for _, code, _ in arts))


def through_dynamo(entry: Any, flat: list) -> tuple:
    """``entry``'s body through ``torch.compile`` (compiling, recompiling, or as dynamo runs
    it while its callback is on); then its artifacts are read again for direct calls."""
    out = entry.compiled(*flat)
    entry.direct = direct_runs(entry.compiled, entry.direct)
    return out
