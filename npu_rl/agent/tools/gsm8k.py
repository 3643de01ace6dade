"""verl's GSM8K answer tool (``calc_gsm8k_reward``): the model submits an answer and hears back whether it parses
and is right; the step reward is -0.05 when a submission does not beat the best so far (verl's penalty), else 0;
``calc_reward`` is the score of the latest submission. Ground truth comes from the row's
``extra_info.tools_kwargs.calc_gsm8k_reward.create_kwargs.ground_truth`` (verl's layout)."""

from __future__ import annotations

from typing import Any, Optional

from npu_rl.agent.tools.base import BaseTool, FunctionSchema, ToolResponse
from npu_rl.reward.scorers import gsm8k_score

NO_IMPROVEMENT_PENALTY = -0.05


class Gsm8kTool(BaseTool):
    @classmethod
    def default_schema(cls) -> Optional[FunctionSchema]:
        return FunctionSchema(
            name="calc_gsm8k_reward",
            description="A tool for calculating the reward of gsm8k. (1.0 if parsed answer is correct, 0.0 if parsed "
                        "answer is incorrect or not correctly parsed)",
            parameters={"type": "object",
                        "properties": {"answer": {"type": "string", "description": "The model's answer to the GSM8K "
                                                  "math problem, must be a digits"}},
                        "required": ["answer"]})

    async def create(self, instance_id: Optional[str] = None, ground_truth: Any = None, **kwargs: Any) -> str:
        instance_id = await super().create(instance_id, **kwargs)
        self.state(instance_id).update(ground_truth=ground_truth, response="", reward=0.0)
        return instance_id

    def _score(self, instance_id: str) -> float:
        state = self.state(instance_id)
        if state.get("ground_truth") is None:
            raise ValueError("calc_gsm8k_reward: no ground truth; the row needs extra_info.tools_kwargs."
                             "calc_gsm8k_reward.create_kwargs.ground_truth")
        return float(gsm8k_score(state["response"], state["ground_truth"], method="flexible")["score"])

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any):
        answer = parameters.get("answer", "")
        answer = answer if isinstance(answer, str) else str(answer)
        state = self.state(instance_id)
        state["response"] = answer if answer.startswith("#### ") else "#### " + answer
        reward = self._score(instance_id)
        step_reward = 0.0 if reward > state["reward"] else NO_IMPROVEMENT_PENALTY
        state["reward"] = max(state["reward"], reward)
        return ToolResponse(f"Current parsed answer={answer!r} reward={reward}"), step_reward, {}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return self._score(instance_id)
