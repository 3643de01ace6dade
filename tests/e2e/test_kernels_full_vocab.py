"""The fused kernels at Qwen's 151,936-column vocabulary (not a multiple of any block size) under Triton: seconds on
a GPU, ~20 s a case in Triton's CPU interpreter, so they run in this lane; the other vocabularies (32,001 and
49,152) and the torch backend at every size are in tests/kernels/."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.conftest import ON_CPU
from tests.kernels.test_full_vocab_kl import check_kl
from tests.kernels.test_linear_logprob import check_parity

VOCAB = 151_936


@pytest.mark.triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_fused_logprob_matches_plain(dtype, device, needs_triton):
    check_parity("triton", VOCAB, dtype, device, num_tokens=19 if ON_CPU else 257, hidden_size=32 if ON_CPU else 96)


@pytest.mark.triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_mm_logprob_matches_plain(dtype, device, needs_triton):
    check_parity("triton_mm", VOCAB, dtype, device, num_tokens=19 if ON_CPU else 257,
                 hidden_size=32 if ON_CPU else 96, vocab_chunk_size=50_000)


@pytest.mark.triton
def test_triton_full_vocab_kl_matches_plain(device, needs_triton):
    check_kl("triton", VOCAB, torch.float32, device, num_tokens=13 if ON_CPU else 129, hidden_size=32 if ON_CPU else 96,
             ref_hidden_size=16 if ON_CPU else 64, vocab_chunk_size=20_000)
