"""The checks of a loaded config that need the rest of the house, run by :mod:`npu_rl.trainer.preflight` before
anything heavy starts (the rules a config slice keeps about its own keys are in the schema, ``check(key)``).

- :mod:`.names`: every key that names something (an engine, an estimator, a loss, a logger, a dtype ...) is asked of
  the code that implements those names (its registry or its constant), so a plug-in path is loaded and checked here;
  the rules that depend on what the estimator reads; LoRA; trackers' packages and credentials.
- :mod:`.files`: data files and their rows, model folders, the output folder (only with ``check_paths``).
- :mod:`.device`: the device asked for, its count, the profiler tools it has (only with ``check_device``).

Each returns its problems (raises nothing); each problem names the key and what to change.
"""
