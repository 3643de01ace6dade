"""verl compatibility: what each key of verl's config tree is here, and how verl's run scripts become npu-rl's.

- ``keys.yaml``: the table, as data (every verl key or key pattern -> implemented / alias / no effect / refused).
- :mod:`.keys`: the classifier that reads it (``classify(key)``, ``is_off(key, value)``).
- :mod:`.translate`: ``translate_overrides``: verl's overrides rewritten into ours before the config loads.
- :mod:`.script`: reads the overrides a run script passes to ``main_ppo`` (runs it in a restricted bash that runs
  no other command).
- :mod:`.migrate`: the per-override report and the equivalent npu-rl command (``npu-rl migrate``).

This room sits just above ``config/``: it imports only ``config`` and ``utils``.
"""
