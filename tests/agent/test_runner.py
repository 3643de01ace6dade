"""Running loops over a batch: turn batching, per-row agent selection, user loops by path, and the hf engine."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import torch

from npu_rl.agent.loops import AgentSettings
from npu_rl.agent.runner import run_agent_loops
from npu_rl.agent.tools.calculator import CalculatorTool
from npu_rl.protocol import Batch
from tests.agent.helpers import IM_END, context

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>'


def prompt_batch(tok, questions, agent_names=None):
    messages = [[{"role": "user", "content": q}] for q in questions]
    ids = [tok.encode(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
           for q in questions]
    width = max(map(len, ids))
    input_ids = torch.zeros(len(ids), width, dtype=torch.long)
    mask = torch.zeros(len(ids), width, dtype=torch.long)
    for i, row in enumerate(ids):
        input_ids[i, width - len(row):] = torch.tensor(row)
        mask[i, width - len(row):] = 1
    non_tensors = {"raw_prompt": messages, "uid": [str(i) for i in range(len(ids))],
                   "extra_info": [{} for _ in ids]}
    if agent_names is not None:
        non_tensors["agent_name"] = agent_names
    return Batch({"input_ids": input_ids, "attention_mask": mask}, non_tensors)


def scripted_batch_generate(tok, script):
    """A batch_generate that answers from ``script[question][turn]`` and records each call's size."""
    calls = []

    def generate(token_lists, budgets):
        calls.append(len(token_lists))
        out = []
        for ids in token_lists:
            text = tok.decode(ids)
            question = next(q for q in script if f"user\n{q}" in text)
            turn = text.count("<|im_start|>assistant") - 1
            reply = tok.encode(script[question][turn], add_special_tokens=False) + [IM_END]
            out.append((reply, [-1.0] * len(reply)))
        return out

    return generate, calls


def test_samples_with_different_turn_counts_share_engine_calls(tiny_tokenizer):
    tok = tiny_tokenizer
    script = {"a": [CALL % "1+1", CALL % "2+2", "4"], "b": [CALL % "3*3", "9"], "c": ["no tool"]}
    generate, calls = scripted_batch_generate(tok, script)
    ctx = context(tok, None, tools={"calculator": CalculatorTool()}, default_agent_loop="tool_agent")
    generated = run_agent_loops(prompt_batch(tok, ["a", "b", "c"]), ctx, generate, n=2, pad_token_id=0,
                                response_length=300, return_logprobs=True)
    out = generated.batch
    # turn 1: all 6 samples; turn 2: a and b (4); turn 3: a (2)
    assert calls == [6, 4, 2]
    assert out["__num_turns__"].tolist() == [6, 6, 4, 4, 2, 2]
    assert list(out["uid"]) == ["0", "0", "1", "1", "2", "2"]  # interleaved, prompt 0's samples first
    m = generated.metrics
    assert m["num_turns/max"] == 6 and m["num_turns/min"] == 2
    assert m["agent_loop/num_tool_calls/mean"] == pytest.approx(1.0)
    assert m["agent_loop/tool_call_rate"] == pytest.approx(4 / 6)
    assert m["agent_loop/engine_calls"] == 3 and m["agent_loop/tool_errors"] == 0
    assert "agent_loop/response_length/turn_3/mean" in m
    assert torch.equal(out["rollout_logprobs"] != 0, out["response_mask"].bool())


def test_agent_name_per_row_and_user_loop_from_the_config(tiny_tokenizer, tmp_path):
    tok = tiny_tokenizer
    path = tmp_path / "my_loop.py"
    path.write_text(textwrap.dedent("""
        from npu_rl.agent.conversation import Conversation
        from npu_rl.agent.loops import AgentLoopBase, AgentOutput

        class Twice(AgentLoopBase):
            async def run(self, sample):
                conv = Conversation(self.ctx.tokenizer, list(sample.messages), stop_texts=self.ctx.stop_texts)
                conv.start(sample.prompt_ids)
                await self.generate_turn(conv)
                conv.add_messages([{"role": "user", "content": "again"}])
                await self.generate_turn(conv)
                return AgentOutput.of(conv, num_turns=4)
        """))
    from npu_rl.agent.loops import register_agent_loops_file

    loops = tmp_path / "loops.yaml"
    loops.write_text(f"- name: twice\n  _target_: {path}:Twice\n")
    assert register_agent_loops_file(str(loops)) == ["twice"]  # the config names the code; the row only the name
    script = {"a": ["x", "y"], "b": [CALL % "1+1", "2"]}
    generate, calls = scripted_batch_generate(tok, script)
    ctx = context(tok, None, tools={"calculator": CalculatorTool()})  # default: single_turn_agent
    batch = prompt_batch(tok, ["a", "b", "a"], agent_names=["twice", "tool_agent", None])
    out = run_agent_loops(batch, ctx, generate, n=1, pad_token_id=0, response_length=300, return_logprobs=False).batch
    assert out["__num_turns__"].tolist() == [4, 4, 2]
    texts = [tok.decode(r[m.bool()].tolist()) for r, m in zip(out["responses"], out["response_mask"])]
    assert texts == ["x<|im_end|>y<|im_end|>", f"{CALL % '1+1'}<|im_end|>2<|im_end|>", "x<|im_end|>"]
    assert "rollout_logprobs" not in out.tensors


def test_unknown_agent_name_fails_its_rows_listing_the_known_ones(tiny_tokenizer):
    tok = tiny_tokenizer
    generate, _ = scripted_batch_generate(tok, {"a": ["x"], "b": ["y"]})
    gen = run_agent_loops(prompt_batch(tok, ["a", "b"], ["nope", None]), context(tok, None), generate, 1, 0, 50,
                          False)
    out = gen.batch
    assert gen.metrics["agent_loop/failed_samples"] == 1
    assert out["response_mask"][0].sum() == 0 and out["response_mask"][1].sum() > 0
    with pytest.raises(RuntimeError, match="every agent conversation.*'nope' is not a registered agent loop; "
                                           "known: .*single_turn_agent, tool_agent"):
        run_agent_loops(prompt_batch(tok, ["a"], ["nope"]), context(tok, None), generate, 1, 0, 50, False)


def test_engine_error_reaches_every_waiting_loop(tiny_tokenizer):
    tok = tiny_tokenizer

    def broken(token_lists, budgets):
        raise RuntimeError("engine down")

    with pytest.raises(RuntimeError, match="engine down"):
        run_agent_loops(prompt_batch(tok, ["a", "b"]), context(tok, None), broken, 2, 0, 50, False)


def test_hf_engine_through_agent_rollout(tiny_model_dir, tmp_path):
    """The hf engine drives tool_agent turn by turn; the batch has the rollout layout and a prefix mask on
    single-turn rows (a random model rarely emits a tool call, so this checks plumbing, not tool use)."""
    from npu_rl.agent.rollout import AgentRollout
    from npu_rl.config.schema import AgentLoopConfig, MultiTurnConfig, RolloutConfig
    from npu_rl.models.loader import load_tokenizer
    from npu_rl.rollout.base import SamplingParams
    from npu_rl.rollout.hf import HFRolloutEngine

    tok = load_tokenizer(tiny_model_dir)
    tools = tmp_path / "tools.yaml"
    tools.write_text("tools:\n  - class_name: npu_rl.agent.tools.calculator.CalculatorTool\n")
    cfg = RolloutConfig(mode="async", multi_turn=MultiTurnConfig(enable=True, tool_config_path=str(tools),
                                                                 max_assistant_turns=3),
                        agent=AgentLoopConfig(default_agent_loop="tool_agent"))
    rollout = AgentRollout(cfg, tok, [IM_END], response_length=16)
    engine = HFRolloutEngine.from_pretrained(tiny_model_dir, tok.pad_token_id, dtype="fp32", device="cpu")
    sampling = SamplingParams(n=2, temperature=1.0, max_new_tokens=16, stop_token_ids=[IM_END], return_logprobs=True)
    torch.manual_seed(0)
    generated = rollout.generate(engine, prompt_batch(tok, ["hi", "what is 2+2"]), sampling)
    out = generated.batch
    assert out["responses"].shape == (4, 16) and out["input_ids"].shape[1] == out["prompts"].shape[1] + 16
    assert out["response_mask"].sum() > 0
    lengths = out["attention_mask"][:, out["prompts"].shape[1]:].sum(-1)
    assert (lengths >= out["response_mask"].sum(-1)).all()
    assert generated.metrics["num_turns/min"] >= 2 and generated.metrics["timing_s/rollout_decode"] > 0
    assert np.all(out["__num_turns__"] >= 2)


def test_single_turn_agent_equals_the_sync_rollout(tiny_model_dir):
    """mode=async with the default loop gives the sync engine's batch: same tokens, masks, positions (greedy)."""
    from npu_rl.agent.rollout import AgentRollout
    from npu_rl.config.schema import RolloutConfig
    from npu_rl.models.loader import load_tokenizer
    from npu_rl.rollout.base import SamplingParams
    from npu_rl.rollout.hf import HFRolloutEngine

    tok = load_tokenizer(tiny_model_dir)
    engine = HFRolloutEngine.from_pretrained(tiny_model_dir, tok.pad_token_id, dtype="fp32", device="cpu")
    prompts = prompt_batch(tok, ["hi", "what is 2+2", "x"])
    sampling = SamplingParams(n=2, do_sample=False, max_new_tokens=12, stop_token_ids=[IM_END], return_logprobs=True)
    want = engine.generate(prompts, sampling).batch
    got = AgentRollout(RolloutConfig(mode="async"), tok, [IM_END], response_length=12).generate(engine, prompts,
                                                                                                sampling).batch
    for key in ("prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids"):
        assert torch.equal(got[key].long(), want[key].long()), key
    torch.testing.assert_close(got["rollout_logprobs"], want["rollout_logprobs"])
    assert got["__num_turns__"].tolist() == [2] * 6
