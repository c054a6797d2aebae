"""Child script: print the cache keys of every foreign class (base and variant) as JSON."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import guards  # noqa: E402
from _foreign_classes import CLASSES  # noqa: E402

print(json.dumps({c.name: [guards.cache_key(c.make(32)), guards.cache_key(c.make(32, True))] for c in CLASSES}))
