"""Three image prompts as the rollout engines get them (tests of the hf and vLLM engines with images): one image,
none, two images (the second of them the first's picture again)."""

from npu_rl.data.dataset import PromptDataset
from npu_rl.data.io import write_parquet
from npu_rl.data.loader import PromptCollator
from npu_rl.models.loader import load_tokenizer
from npu_rl.models.vision import load_vision_inputs


def image_prompt_batch(folder: str, tmp_path, pngs: list[bytes], processor_kwargs: dict | None = None):
    """(the collated batch, the tokenizer) of three rows of the model in ``folder``: ``pngs[0]``, no image, then
    ``pngs[1]`` and ``pngs[0]``; ``processor_kwargs``: data.mm_processor_kwargs."""
    tokenizer = load_tokenizer(folder)
    vision = load_vision_inputs(folder, processor_kwargs) if processor_kwargs else load_vision_inputs(folder)
    rows = [{"prompt": [{"role": "user", "content": "<image>How many?"}], "images": [{"bytes": pngs[0]}],
             "data_source": "shapes", "reward_model": {"ground_truth": "1"}},
            {"prompt": [{"role": "user", "content": "no picture"}], "images": [], "data_source": "shapes",
             "reward_model": {"ground_truth": "1"}},
            {"prompt": [{"role": "user", "content": "<image> and <image>?"}],
             "images": [{"bytes": pngs[1]}, {"bytes": pngs[0]}], "data_source": "shapes",
             "reward_model": {"ground_truth": "2"}}]
    path = str(tmp_path / "rows.parquet")
    write_parquet(rows, path)
    data = PromptDataset(path, tokenizer, vision=vision, max_prompt_length=200)
    return PromptCollator(tokenizer.pad_token_id, vision)([data[i] for i in range(len(data))]), tokenizer
