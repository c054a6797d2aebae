"""guards: guard sets, explanations, stable cache keys and guarded dispatch for wrapped tensors.

Layer: imports ``symbolic`` and ``torch`` only; never ``subclass_kit``. Works on any
traceable wrapper subclass (``__tensor_flatten__``), torch's TwoTensor and DTensor included.
This module only re-exports; what is not re-exported is private.
"""

from .keys import cache_key as cache_key, cache_key_payload as cache_key_payload
from .errors import (
    DispatcherLimitWarning as DispatcherLimitWarning,
    GuardError as GuardError,
    PolicyViolationError as PolicyViolationError,
    UnguardableValueError as UnguardableValueError,
    UnhashableContextError as UnhashableContextError,
    UnstableKeyError as UnstableKeyError,
    UnsupportedValueError as UnsupportedValueError,
)
from .dispatcher import GuardedDispatcher as GuardedDispatcher
from .guardset import GuardSet as GuardSet, build as build, build_call as build_call
from .recompiles import (
    CallRecord as CallRecord,
    RecompileReport as RecompileReport,
    explain_recompiles as explain_recompiles,
)

__all__ = [
    "build",
    "build_call",
    "GuardSet",
    "GuardedDispatcher",
    "explain_recompiles",
    "RecompileReport",
    "CallRecord",
    "cache_key",
    "cache_key_payload",
    "GuardError",
    "DispatcherLimitWarning",
    "UnhashableContextError",
    "UnguardableValueError",
    "UnstableKeyError",
    "PolicyViolationError",
    "UnsupportedValueError",
]
