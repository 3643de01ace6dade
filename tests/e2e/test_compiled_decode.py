"""torch.compile of the packed-attention model and compiled decoding in the hf engine (tens of seconds of compile
on a CPU; the rest of the hf engine's tests are in tests/rollout/test_hf.py)."""

from __future__ import annotations

import torch
from torch.testing import assert_close

from npu_rl.rollout.hf import HFRolloutEngine
from tests.rollout.conftest import make_prompts
from tests.rollout.test_hf import eos_model, greedy  # noqa: F401 (a fixture)


def test_packed_attention_model_compiles_without_graph_breaks_and_decodes_like_sdpa(eos_model):  # noqa: F811
    """A model set to the packed-attention implementation (remove-padding) is sdpa outside packed mode; under
    ``torch.compile`` it must trace as one graph (it once read a context variable in every layer: a graph break per
    layer, and compiled decoding ran at eager speed), and its generation equals the plain model's."""
    import copy

    from npu_rl.parallel.attention import ATTN_IMPLEMENTATION, use_varlen_attention

    model, tokenizer = eos_model
    packed = use_varlen_attention(copy.deepcopy(model)).eval()
    ids = make_prompts(tokenizer)["input_ids"]
    logits = torch.compile(packed, fullgraph=True)(input_ids=ids).logits  # raises on a graph break
    assert_close(logits, model(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
    prompts = make_prompts(tokenizer)
    out = HFRolloutEngine(packed, tokenizer.pad_token_id, compiled_decode=True).generate(prompts, greedy()).batch
    assert packed.config._attn_implementation == ATTN_IMPLEMENTATION
    eager = HFRolloutEngine(model, tokenizer.pad_token_id).generate(prompts, greedy()).batch
    assert torch.equal(out["responses"], eager["responses"])
