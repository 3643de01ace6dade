"""Prints its arguments as JSON (tests/project/test_examples.py runs the example scripts with this as the trainer)."""
import json
import sys

print(json.dumps(sys.argv[1:]))
