"""verl's experimental entry points, by the same module names: the asynchronous trainers (docs/async.md)."""
