"""Exemplar subclasses built on ``WrapperTensor`` alone. Layer: subclass_kit (exemplars)."""

from .block_scaled import BlockScaled as BlockScaled
from .jagged import JaggedLayoutError as JaggedLayoutError
from .jagged import JaggedTensor as JaggedTensor
from .scaled import ScaledTensor as ScaledTensor
from .two_tensor import TwoTensor as TwoTensor
from . import _jagged_ops  # noqa: F401  (registers JaggedTensor's ops)

__all__ = ["TwoTensor", "ScaledTensor", "BlockScaled", "JaggedTensor", "JaggedLayoutError"]
