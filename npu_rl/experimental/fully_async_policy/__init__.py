"""``python -m npu_rl.experimental.fully_async_policy.fully_async_main``: verl's fully asynchronous trainer
(docs/async.md)."""
