"""subclass_kit.testing: the conformance checker for wrapper tensor subclasses.

Layer: the top of ``subclass_kit`` (imports the kit, torch; ``symbolic`` and ``guards``
only where they help). ``check_subclass`` is to tensor subclasses what
``torch.library.opcheck`` is to custom ops: it answers "is this class compile-ready, and
if not, what exactly is wrong?". It works on any traceable wrapper subclass (torch's
TwoTensor, DTensor), reporting what a class lacks; the kit's extras are duck-typed.

Example:
    >>> import torch
    >>> from torch.testing._internal.two_tensor import TwoTensor
    >>> from subclass_kit.testing import check_subclass
    >>> report = check_subclass(TwoTensor(torch.randn(3, 4), torch.randn(3, 4)), backends=("eager",), only=["ctx"])
    >>> [(r.name, r.status) for r in report.rows][:2]
    [('ctx.hashable', 'pass'), ('ctx.immutable', 'pass')]
"""

from .errors import SamplesError as SamplesError, SubclassCheckError as SubclassCheckError
from .parametrize import parametrize_backends as parametrize_backends, parametrize_pytree_impls as parametrize_pytree_impls
from .opinfo import OpResult as OpResult, OpSweep as OpSweep, sweep_op as sweep_op, sweep_ops as sweep_ops
from .report import CheckReport as CheckReport, CheckRow as CheckRow
from .runner import check_subclass as check_subclass

__all__ = [
    "check_subclass",
    "CheckReport",
    "CheckRow",
    "SubclassCheckError",
    "SamplesError",
    "parametrize_backends",
    "parametrize_pytree_impls",
    "sweep_ops",
    "sweep_op",
    "OpSweep",
    "OpResult",
]
