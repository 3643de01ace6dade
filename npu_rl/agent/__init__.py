"""Agent-loop rollouts: each sample runs as a conversation (tools, interactions), assembled into a batch whose
``response_mask`` marks only model-generated tokens. See docs/agents.md.

- ``loops``: the agent-loop registry (``single_turn_agent``, ``tool_agent``, user classes by path)
- ``conversation``: tokens and masks of a conversation; tools rendered through the chat template
- ``tool_parser``: tool calls out of model text (hermes)
- ``tools``: the tool interface, verl's tool config file, the calculator and GSM8K tools
- ``interactions``: scripted user turns
- ``runner``: running the loops over a batch; batch assembly; metrics
- ``rollout``: what the actor-rollout worker holds (built from ``actor_rollout_ref.rollout``)
- ``tasks``: the built-in calculator task (``builtin://arith_tool``)
"""
