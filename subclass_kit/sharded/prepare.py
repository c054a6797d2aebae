"""The styles that only convert layouts at a module's boundary: ``PrepareModuleInput``
(positional and keyword inputs), ``PrepareModuleOutput`` and ``PrepareModuleInputOutput``,
with torch's names and semantics (``torch.distributed.tensor.parallel``).

Layout lists that do not pair up are refused when the style is made; a call with another
number of positional inputs than layouts, or an input whose placements contradict its
layout, when the module runs -- as torch refuses them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from ..compiling import is_compiling
from .convert import to_local
from .errors import ParallelizeError
from .parallel import ParallelStyle, _check_mesh, _dim, _one, _to_sharded
from .mesh import MeshLike
from .placements import render
from .tensor import ShardedTensor

__all__ = ["PrepareModuleInput", "PrepareModuleOutput", "PrepareModuleInputOutput"]


def _layouts(value, kind: str, field: str, name: str) -> tuple | None:
    if value is None:
        return None
    items = value if isinstance(value, (list, tuple)) else (value,)
    return tuple(None if v is None else _one(v, kind, field, name) for v in items)


def _as_tuple(value) -> tuple | None:
    return None if value is None else tuple(value) if isinstance(value, (list, tuple)) else (value,)


def _shown(layouts) -> str:
    if layouts is None:
        return "None"
    return f"{render(list(layouts))} ({len(layouts)} {'entry' if len(layouts) == 1 else 'entries'})"


def _check_pairs(style, side: str) -> None:
    """Refuse, when the style is made, ``{side}_layouts`` and ``desired_{side}_layouts`` that
    do not pair up (torch refuses them there too), and kwarg layouts with different keys."""
    kind = type(style).__name__
    have, want = _as_tuple(getattr(style, f"{side}_layouts")), _as_tuple(getattr(style, f"desired_{side}_layouts"))
    if (have is None) != (want is None) or (have is not None and want is not None and len(have) != len(want)):
        raise ParallelizeError(
            f"{kind}: {side}_layouts and desired_{side}_layouts should have same length, got "
            f"{side}_layouts={_shown(have)} and desired_{side}_layouts={_shown(want)}; give one entry "
            f"per {side} in both (None for one left alone), e.g. {side}_layouts=(Shard(1), None), "
            f"desired_{side}_layouts=(Replicate(), None)."
        )
    for i, (h, w) in enumerate(zip(have or (), want or ())):
        if (h is None) != (w is None):
            raise ParallelizeError(
                f"{kind}: {side} {i} has {side}_layouts {h!r} but desired_{side}_layouts {w!r}; "
                "give both or neither."
            )
    if side == "input":
        kw_have, kw_want = style.input_kwarg_layouts, style.desired_input_kwarg_layouts
        if (kw_have is None) != (kw_want is None) or (kw_have is not None and set(kw_have) != set(kw_want)):
            raise ParallelizeError(
                f"{kind}: input_kwarg_layouts {kw_have!r} and desired_input_kwarg_layouts {kw_want!r} "
                "should have the same keys; give both, one entry per keyword input to convert."
            )
        if have is None and kw_have is None:
            raise ParallelizeError(
                f"{kind}: no layouts given; pass input_layouts/desired_input_layouts (positional "
                "inputs) or input_kwarg_layouts/desired_input_kwarg_layouts (keyword inputs)."
            )
    elif style.output_layouts is None:
        raise ParallelizeError(f"{kind}: output_layouts and desired_output_layouts are required, one entry per output.")


def _convert(x, h, w, ref, kind: str, name: str, what: str, field: str, use_local: bool, fix: str):
    """``x`` laid out ``h`` (a plain tensor: this rank's part) redistributed to ``w``."""
    if isinstance(x, ShardedTensor) and not is_compiling() and x.placements != (_dim(h, x.dim()),):
        raise ParallelizeError(
            f"{kind} on {name!r}: {what} is a ShardedTensor with placements "
            f"{render(x.placements)} but {field} says {h!r}; {fix}"
        )
    y = _to_sharded(x, ref, h, w, kind, name, what)
    return to_local(y) if use_local else y


def _convert_all(values: list, have, want, ref, kind: str, name: str, side: str, use_local: bool, fix: str) -> None:
    """Redistribute ``values[i]`` from ``have[i]`` to ``want[i]`` in place (None: left alone)."""
    for i, (h, w) in enumerate(zip(have, want)):
        if h is not None:
            field = f"{side}_layouts[{i}]"
            values[i] = _convert(values[i], h, w, ref, kind, name, f"{side} {i}", field, use_local, fix.format(what=field))


def _input_hook(style, ref, kind: str, name: str, use_local: bool):
    """The forward pre-hook (with kwargs) converting a module's inputs as ``style`` says."""
    have = _layouts(style.input_layouts, kind, "input_layouts", name)
    want = _layouts(style.desired_input_layouts, kind, "desired_input_layouts", name)
    kw = {k: (_one(h, kind, f"input_kwarg_layouts[{k!r}]", name) if h is not None else None,
              _one(style.desired_input_kwarg_layouts[k], kind, f"desired_input_kwarg_layouts[{k!r}]", name))
          for k, h in (style.input_kwarg_layouts or {}).items()}
    fix = "make {what} match what the previous module outputs."

    def pre_hook(mod, args, kwargs):
        if have is not None:
            if len(args) != len(have):
                raise ParallelizeError(
                    f"{kind} on {name!r}: module inputs and input_layouts should have same length: "
                    f"layouts are given for {len(have)} positional inputs {render(list(have))} but the "
                    f"module was called with {len(args)}; give one layout per positional input (None "
                    "for an input left alone), or pass the inputs positionally."
                )
            args = list(args)
            _convert_all(args, have, want, ref, kind, name, "input", use_local, fix)
        for k, (h, w) in kw.items():
            if h is not None and kwargs.get(k) is not None:
                field = f"input_kwarg_layouts[{k!r}]"
                kwargs[k] = _convert(kwargs[k], h, w, ref, kind, name, f"keyword input {k!r}", field, use_local,
                                     f"make {field} match what the caller passes.")
        return tuple(args), kwargs

    return pre_hook


def _output_hook(style, ref, kind: str, name: str, use_local: bool):
    have = _layouts(style.output_layouts, kind, "output_layouts", name)
    want = _layouts(style.desired_output_layouts, kind, "desired_output_layouts", name)

    def post_hook(mod, args, out):
        single = not isinstance(out, (tuple, list))
        outs = [out] if single else list(out)
        if len(outs) != len(have):
            raise ParallelizeError(
                f"{kind} on {name!r}: {len(have)} output layouts but the module returned "
                f"{len(outs)} outputs; give one layout per output (None to leave one alone)."
            )
        _convert_all(outs, have, want, ref, kind, name, "output", use_local, "make {what} match the output.")
        return outs[0] if single else type(out)(outs)

    return post_hook


@dataclass(frozen=True, kw_only=True)
class PrepareModuleInput(ParallelStyle):
    """Convert a module's inputs at its boundary: positional input ``i`` arrives
    ``input_layouts[i]`` (a plain tensor is this rank's part) and is redistributed to
    ``desired_input_layouts[i]``; ``None`` leaves an input alone (e.g. ``freqs_cis``).
    Keyword inputs likewise, by name, with ``input_kwarg_layouts`` /
    ``desired_input_kwarg_layouts``.

    Args:
        input_layouts: one placement (or None) per positional input; None: positional
            inputs are left alone.
        desired_input_layouts: the same length: what the module needs.
        input_kwarg_layouts, desired_input_kwarg_layouts: ``{keyword: placement}``, the same keys.
        use_local_output: hand the module local tensors instead of ShardedTensors (default False).

    Raises:
        ParallelizeError: (when made) layouts that do not pair up; (when the module runs) a
            number of positional inputs other than ``len(input_layouts)``.

    Example:
        >>> from subclass_kit.sharded import PrepareModuleInput, Shard, Replicate
        >>> PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)).use_local_output
        False
    """

    input_layouts: Any = None
    desired_input_layouts: Any = None
    input_kwarg_layouts: dict | None = None
    desired_input_kwarg_layouts: dict | None = None
    use_local_output: bool = False

    def __post_init__(self):
        _check_pairs(self, "input")

    def apply(self, module: nn.Module, mesh: MeshLike, name: str = "module", *, src_data_rank: int | None = 0) -> nn.Module:
        kind = type(self).__name__
        ref = _check_mesh(mesh, kind, name)
        module.register_forward_pre_hook(_input_hook(self, ref, kind, name, self.use_local_output), with_kwargs=True)
        return module


@dataclass(frozen=True, kw_only=True)
class PrepareModuleOutput(ParallelStyle):
    """Convert a module's outputs: output ``i`` is ``output_layouts[i]`` (a plain tensor is
    this rank's part) and is redistributed to ``desired_output_layouts[i]``.

    Args:
        output_layouts: one placement (or None) per output (a single output: one placement).
        desired_output_layouts: the same length.
        use_local_output: return local tensors (default True).

    Example:
        >>> from subclass_kit.sharded import PrepareModuleOutput, Shard, Replicate
        >>> PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1)).use_local_output
        True
    """

    output_layouts: Any = None
    desired_output_layouts: Any = None
    use_local_output: bool = True

    def __post_init__(self):
        _check_pairs(self, "output")

    def apply(self, module: nn.Module, mesh: MeshLike, name: str = "module", *, src_data_rank: int | None = 0) -> nn.Module:
        kind = type(self).__name__
        ref = _check_mesh(mesh, kind, name)
        module.register_forward_hook(_output_hook(self, ref, kind, name, self.use_local_output))
        return module


@dataclass(frozen=True, kw_only=True)
class PrepareModuleInputOutput(ParallelStyle):
    """``PrepareModuleInput`` and ``PrepareModuleOutput`` on one module: its inputs are
    converted on the way in, its outputs on the way out.

    Args:
        input_layouts, desired_input_layouts, input_kwarg_layouts, desired_input_kwarg_layouts:
            as ``PrepareModuleInput``.
        use_local_input: hand the module local tensors (default False).
        output_layouts, desired_output_layouts: as ``PrepareModuleOutput``.
        use_local_output: return local tensors (default True).

    Example:
        >>> from subclass_kit.sharded import PrepareModuleInputOutput, Shard, Replicate
        >>> s = PrepareModuleInputOutput(input_layouts=Shard(0), desired_input_layouts=Replicate(),
        ...                              output_layouts=Replicate(), desired_output_layouts=Shard(1))
        >>> s.use_local_input, s.use_local_output
        (False, True)
    """

    input_layouts: Any = None
    desired_input_layouts: Any = None
    input_kwarg_layouts: dict | None = None
    desired_input_kwarg_layouts: dict | None = None
    use_local_input: bool = False
    output_layouts: Any = None
    desired_output_layouts: Any = None
    use_local_output: bool = True

    def __post_init__(self):
        _check_pairs(self, "input")
        _check_pairs(self, "output")

    def apply(self, module: nn.Module, mesh: MeshLike, name: str = "module", *, src_data_rank: int | None = 0) -> nn.Module:
        kind = type(self).__name__
        ref = _check_mesh(mesh, kind, name)
        module.register_forward_pre_hook(_input_hook(self, ref, kind, name, self.use_local_input), with_kwargs=True)
        module.register_forward_hook(_output_hook(self, ref, kind, name, self.use_local_output))
        return module
