"""``JaggedTensor``: a batch of variable-length sequences, packed back to back.

The class itself: fields, construction, the dense views and the checker's hooks. Its ops
live in ``_jagged_ops.py`` (the package imports it, which registers them).
"""

from __future__ import annotations

from typing import Sequence

import torch

from symbolic import FREE

from .. import _compat
from ..base import WrapperTensor
from ..errors import SubclassKitError
from ..fields import inner

__all__ = ["JaggedTensor", "JaggedLayoutError"]


class JaggedLayoutError(SubclassKitError, ValueError):
    """Two jagged operands whose sequences do not line up, or a list that cannot be packed."""


class JaggedTensor(WrapperTensor):
    """Variable-length sequences ``(len_i, D)`` packed into one ``(total_tokens, D)`` tensor.

    The outer shape is the padded ``(B, max_len, D)``; only the first ``len_i`` rows of
    sequence ``i`` mean something (``__plain_mask__``). ``to_plain()`` is the zero-padded
    dense tensor. Ops: pointwise (with scalars, a plain ``(D,)`` operand, or a JaggedTensor
    with the same offsets), ``F.linear``, activations, per-sequence ``sum``/``mean`` over
    dim 1 (a plain ``(B, D)`` result) and ``softmax`` over dim 1, each with the backward of
    the dense padded model on the meaningful positions.

    Exercises: an inner tensor with a free dim (total tokens, set by the data, not by the
    outer shape), torch-function handlers that keep autograd (``wrap``/``unwrap``), a
    meaningful-position mask for the checker, and samples at other sizes for its sweep.

    Example:
        >>> import torch
        >>> x = JaggedTensor.from_list([torch.ones(2, 3), torch.ones(4, 3)])
        >>> tuple(x.shape), tuple(x.packed.shape), x.seq_offsets.tolist(), x.lengths().tolist()
        ((2, 4, 3), (6, 3), [0, 2, 6], [2, 4])
        >>> torch.nn.functional.linear(x, torch.eye(3)).mean(dim=1)
        tensor([[1., 1., 1.],
                [1., 1., 1.]])
    """

    packed: torch.Tensor = inner(doc="(total_tokens, D): the rows of every sequence, back to back")
    seq_offsets: torch.Tensor = inner(
        dtype=torch.int64, doc="(B + 1,): sequence i is packed[seq_offsets[i]:seq_offsets[i + 1]]"
    )
    seq_index: torch.Tensor = inner(
        optional=True, dtype=torch.int64,
        doc="(total_tokens,): the sequence of each row of packed, derived from seq_offsets once per batch",
    )

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        batch, _max_len, dim = outer_size
        # Total tokens is set by the data alone: FREE. D is still the outer D.
        return {"packed": (FREE, dim), "seq_offsets": (batch + 1,), "seq_index": (FREE,)}

    # ---- construction ------------------------------------------------------------------
    @classmethod
    def from_list(cls, tensors: Sequence[torch.Tensor]) -> "JaggedTensor":
        """Pack ``[t_1, ..., t_B]``, each ``(len_i, D)``, into one JaggedTensor.

        Differentiable: gradients flow back into the list's tensors.

        Args:
            tensors: 2-D tensors with the same ``D``, dtype and device (``len_i`` may be 0).

        Returns:
            A JaggedTensor of outer shape ``(B, max(len_i), D)``.

        Raises:
            JaggedLayoutError: an empty list, a tensor that is not 2-D, or differing ``D``.

        Example:
            >>> import torch
            >>> x = JaggedTensor.from_list([torch.zeros(1, 2), torch.zeros(3, 2)])
            >>> tuple(x.shape), x.seq_offsets.tolist()
            ((2, 3, 2), [0, 1, 4])
        """
        if not tensors:
            raise JaggedLayoutError("JaggedTensor.from_list needs at least one (len_i, D) tensor; got an empty list.")
        dim = tensors[0].shape[-1] if tensors[0].dim() == 2 else None
        for i, t in enumerate(tensors):
            if t.dim() != 2 or t.shape[1] != dim:
                raise JaggedLayoutError(
                    f"JaggedTensor.from_list: every tensor must be (len_i, D) with the same D; "
                    f"tensor {i} has shape {tuple(t.shape)}, expected (len_{i}, {dim}). Reshape it to 2-D first."
                )
        lengths = [int(t.shape[0]) for t in tensors]
        device = tensors[0].device
        counts = torch.tensor(lengths, dtype=torch.int64)
        offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
        offsets[1:] = counts.cumsum(0)
        seq_index = torch.repeat_interleave(torch.arange(len(lengths)), counts, output_size=int(offsets[-1]))
        return cls.wrap(torch.cat(list(tensors)), offsets.to(device), seq_index.to(device),
                        size=(len(lengths), max(lengths), dim))

    @classmethod
    def from_plain(cls, t: torch.Tensor) -> "JaggedTensor":
        """A ``(B, N, D)`` tensor as B sequences of length N each (no padding): the hook the
        checker's OpInfo sweep builds instances with. Other shapes are a ValueError.

        Example:
            >>> import torch
            >>> JaggedTensor.from_plain(torch.ones(2, 3, 4)).seq_offsets.tolist()
            [0, 3, 6]
        """
        if t.dim() != 3 or not (t.is_floating_point() or t.is_complex()):
            raise ValueError(f"JaggedTensor holds (B, max_len, D) floating tensors; got {t.dim()}-D {t.dtype}")
        b, n, d = t.shape
        offsets = torch.arange(b + 1, dtype=torch.int64, device=t.device) * n
        seq_index = torch.arange(b, device=t.device).repeat_interleave(n, output_size=b * n)
        return cls.wrap(t.reshape(b * n, d), offsets, seq_index, size=tuple(t.shape))

    def rows(self) -> torch.Tensor:
        """``packed``, differentiable: its gradient reaches this wrapper (``unwrap()``'s first
        entry when the wrapper requires grad; the field itself otherwise, which costs nothing)."""
        if self.requires_grad and torch.is_grad_enabled():
            return self.unwrap()[0]
        return self.packed

    # ---- dense views -------------------------------------------------------------------
    def lengths(self) -> torch.Tensor:
        """The ``(B,)`` int64 lengths of the sequences."""
        return self.seq_offsets.diff()

    def token_index(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(seq, pos)``, each ``(total_tokens,)``: row ``k`` of ``packed`` is position
        ``pos[k]`` of sequence ``seq[k]`` (no data-dependent sizes: it compiles with a
        dynamic total)."""
        seq = self.sequence_index()
        k = torch.arange(self.packed.shape[0], device=self.packed.device)
        return seq, k - self.seq_offsets[seq]

    def sequence_index(self) -> torch.Tensor:
        """``(total_tokens,)`` int64: the sequence each row of ``packed`` belongs to.

        The ``seq_index`` field when the wrapper carries it (``from_list``, ``from_plain``
        and every op's result do), else derived from ``seq_offsets``. Carried, it is computed
        once per batch instead of once per reduction, and a compiled graph reads it as an
        input instead of searching the offsets on every call (NJT caches its max/min
        sequence lengths the same way).

        Example:
            >>> import torch
            >>> JaggedTensor.from_list([torch.ones(2, 1), torch.ones(1, 1)]).sequence_index().tolist()
            [0, 0, 1]
        """
        seq = self.seq_index
        if seq is not None:
            return seq
        k = torch.arange(self.packed.shape[0], device=self.packed.device)
        return torch.searchsorted(self.seq_offsets[1:], k, right=True)

    def to_padded(self, padding_value: float = 0.0) -> torch.Tensor:
        """The dense ``(B, max_len, D)`` tensor, ``padding_value`` past each sequence's end.

        Example:
            >>> import torch
            >>> JaggedTensor.from_list([torch.ones(1, 1), torch.ones(2, 1)]).to_padded(-1.0)[:, :, 0]
            tensor([[ 1., -1.],
                    [ 1.,  1.]])
        """
        seq, pos = self.token_index()
        b, n, d = self.shape
        out = torch.full((b, n, d), padding_value, dtype=self.dtype, device=self.packed.device)
        return out.index_put((seq, pos), self.rows())

    def to_plain(self) -> torch.Tensor:
        """The zero-padded dense tensor (``to_padded(0.0)``)."""
        return self.to_padded(0.0)

    # ---- the checker's hooks -------------------------------------------------------------
    def __plain_mask__(self) -> torch.Tensor:
        """``(B, max_len, 1)`` bool: True at the rows that belong to a sequence (not padding)."""
        n = self.shape[1]
        pos = torch.arange(n, device=self.packed.device)
        return (pos[None, :] < self.lengths()[:, None]).unsqueeze(-1)

    @classmethod
    def __samples__(cls):
        g = torch.Generator().manual_seed(3)
        return [
            cls.from_list([torch.randn(n, 6, generator=g) for n in (3, 5, 2)]),
            cls.from_list([torch.randn(n, 5, generator=g) for n in (7, 1)]),
        ]

    @classmethod
    def __dynamic_samples__(cls, sample: "JaggedTensor"):
        """Instances like ``sample`` at other sizes: another B, max_len and total tokens.

        Sizes that equal one another (B + 1 == D, ...) or are 0/1 would be specialized by
        dynamo on their own, so only batches whose B, B + 1, max_len, total and D all
        differ and exceed 1 are given.
        """
        g = torch.Generator().manual_seed(4)
        d = sample.shape[2]
        out = []
        for lengths in ((4, 9, 2, 7), (11, 3, 8), (5, 13, 6, 12, 2), (10, 14, 3)):
            b = len(lengths)
            sizes = (b, b + 1, max(lengths), sum(lengths), d)
            if len(set(sizes)) == len(sizes) and min(sizes) > 1:
                parts = [torch.randn(n, d, generator=g, dtype=sample.dtype) for n in lengths]
                out.append(cls.from_list(parts).requires_grad_(sample.requires_grad))
        return out


def same_layout(a: JaggedTensor, b: JaggedTensor, what: str) -> None:
    """Raise unless ``a`` and ``b`` hold the same sequences' rows (equal offsets). Traced
    offsets have no values to compare: under compile the check is eager's job."""
    oa, ob = a.seq_offsets, b.seq_offsets
    if oa is ob or _compat.is_compiling() or _compat.is_fake(oa) or _compat.is_fake(ob):
        return
    if oa.shape != ob.shape or not torch.equal(oa, ob):
        raise JaggedLayoutError(
            f"JaggedTensor {what}: the operands' sequences differ (seq_offsets {oa.tolist()} vs "
            f"{ob.tolist()}). Combine jagged tensors built from the same batch, or pad both with "
            "to_padded() first."
        )

