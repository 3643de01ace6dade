"""The data loader's position: saved and restored exactly mid-epoch and at an epoch boundary (verl #7401)."""

from __future__ import annotations

import pytest

from npu_rl.config.schema import DataConfig
from npu_rl.data.loader import PromptCollator, PromptDataLoader, build_dataloader
from tests.helpers import make_tiny_tokenizer


class _Rows:
    """A stand-in data set of n prompts whose items say which row they are."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"input_ids": [3, 4 + i % 5], "data_source": "arith", "ground_truth": str(i), "extra_info": {},
                "index": i}


def _loader(n=22, batch_size=4, **kwargs):
    return PromptDataLoader(_Rows(n), batch_size, collate_fn=PromptCollator(0), **kwargs)


def _indices(batch):
    return [int(i) for i in batch["index"]]


def _run(loader, num_batches):
    """``num_batches`` batches across epochs, as the trainer's PromptStream takes them."""
    out, it = [], iter(loader)
    while len(out) < num_batches:
        try:
            out.append(_indices(next(it)))
        except StopIteration:
            it = iter(loader)
    return out


def test_epochs_are_shuffled_deterministically():
    loader = _loader(seed=3)
    assert len(loader) == 5  # 22 prompts, batches of 4, the last partial batch dropped
    epochs = _run(loader, 10)
    first, second = sum(epochs[:5], []), sum(epochs[5:], [])
    assert len(set(first)) == 20 and first != second  # each epoch its own order
    assert _run(_loader(seed=3), 10) == epochs  # the same seed, the same order
    assert _run(_loader(seed=4), 5) != epochs[:5]
    assert sum(_run(_loader(shuffle=False), 5), []) == list(range(20))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_mid_epoch(num_workers):
    reference = _run(_loader(seed=5), 12)
    loader = _loader(seed=5, num_workers=num_workers)
    it = iter(loader)
    taken = [_indices(next(it)), _indices(next(it))]
    state = loader.state_dict()
    assert state["epoch"] == 0 and state["batches_done"] == 2
    resumed = _loader(seed=5, num_workers=num_workers)
    resumed.load_state_dict(state)
    assert taken + _run(resumed, 10) == reference  # the rest of epoch 0, then epoch 1 with its own shuffle


def test_resume_at_the_epoch_boundary_continues_into_the_next_epoch():
    reference = _run(_loader(seed=5), 10)
    loader = _loader(seed=5)
    it = iter(loader)
    taken = [_indices(next(it)) for _ in range(5)]  # the whole of epoch 0, before StopIteration is seen
    state = loader.state_dict()
    assert (state["epoch"], state["batches_done"]) == (1, 0)
    resumed = _loader(seed=5)
    resumed.load_state_dict(state)
    assert resumed.epoch == 1
    rest = _run(resumed, 5)
    assert len(rest) == 5 and taken + rest == reference  # a full epoch 1, not zero steps


def test_a_state_saved_as_epoch_end_is_the_next_epoch_start():
    loader = _loader(seed=5)
    loader.load_state_dict({"epoch": 2, "batches_done": 5})
    assert (loader.epoch, loader.batches_done) == (3, 0)


def test_reloading_invalidates_a_running_iterator():
    loader = _loader(seed=1)
    it = iter(loader)
    next(it)
    loader.load_state_dict({"epoch": 0, "batches_done": 0})
    assert list(it) == []
    assert len(list(loader)) == 5


def test_a_changed_data_set_or_config_refuses_to_resume():
    state = _loader(seed=1).state_dict()
    with pytest.raises(ValueError, match="num_rows=22, this run has 30"):
        _loader(n=30, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="batch_size=4, this run has 2"):
        _loader(batch_size=2, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="batches_done=9"):
        _loader(seed=1).load_state_dict({**state, "batches_done": 9})


def test_too_few_prompts_for_one_batch():
    with pytest.raises(ValueError, match="3 prompts, fewer than one batch of 4"):
        _loader(n=3)


def test_build_dataloader_from_the_data_config():
    tok = make_tiny_tokenizer()
    config = DataConfig(train_files="builtin://arith/train", val_files=["builtin://arith/test"], train_batch_size=8,
                        max_prompt_length=64, dataloader_num_workers=0, return_raw_chat=True)
    train = build_dataloader(config, tok, "train")
    assert len(train) == 75 // 8 and train.shuffle
    batch = next(iter(train))
    assert batch["input_ids"].shape[0] == 8 and set(batch["data_source"]) == {"arith"}
    assert {"raw_prompt", "uid", "ground_truth", "extra_info", "index", "raw_prompt_ids"} <= set(batch.keys())
    val = build_dataloader(config, tok, "val")
    assert len(val) == 1 and not val.shuffle  # the whole validation set at once, in order
    assert [int(i) for i in next(iter(val))["index"]] == list(range(25))
    config.val_batch_size = 10
    assert len(build_dataloader(config, tok, "val")) == 3  # 10 + 10 + 5: nothing dropped
    config.gen_batch_size = 5
    assert build_dataloader(config, tok, "train").batch_size == 5  # DAPO's generation batch
    with pytest.raises(ValueError, match="split must be"):
        build_dataloader(config, tok, "test")
