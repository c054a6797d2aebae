"""Child script: print the cache keys of every foreign class (base and variant) as JSON."""

import json
import os
import sys

# tests/, as pytest's ``pythonpath`` has it: the classes keep the module name they have in the
# test process (a class's module is part of its cache key).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import guards  # noqa: E402
from foreign._foreign_classes import CLASSES  # noqa: E402

print(json.dumps({c.name: [guards.cache_key(c.make(32)), guards.cache_key(c.make(32, True))] for c in CLASSES}))
