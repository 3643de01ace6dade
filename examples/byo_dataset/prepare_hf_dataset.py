"""Turn a Hugging Face data set of question/answer rows into npu-rl's (verl's) prompt schema.

    # online, from the Hub (the only step that downloads anything):
    python examples/byo_dataset/prepare_hf_dataset.py --dataset openai/gsm8k --subset main \
        --question question --answer answer --answer-regex '#### (.+)' --out ~/data/my_gsm8k
    # offline, from a folder written by datasets' save_to_disk (a DatasetDict with train / test):
    python examples/byo_dataset/prepare_hf_dataset.py --from-disk ./raw --question question --answer answer \
        --out ~/data/my_set

Writes one save_to_disk folder per split (``<out>/train``, ``<out>/test``) that ``data.train_files`` /
``data.val_files`` take as they are. Each row: ``data_source`` (picks the reward function), ``prompt`` (chat
messages), ``ability``, ``reward_model.ground_truth`` (the bare answer) and ``extra_info`` (split, index, raw text).
docs/byo_dataset.md walks through it with the reward function beside this file.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def to_row(raw: dict, index: int, split: str, args: argparse.Namespace) -> dict:
    question, answer = str(raw[args.question]), str(raw[args.answer])
    if args.answer_regex:
        match = re.search(args.answer_regex, answer)
        if match is None:
            raise ValueError(f"{split} row {index}: {args.answer_regex!r} finds no answer in {answer[-80:]!r}")
        answer = match.group(1)
    return {
        "data_source": args.data_source,
        "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer.strip().replace(",", "")},
        "extra_info": {"split": split, "index": index, "question": question, "answer": str(raw[args.answer])},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--dataset", help="Hub id, e.g. openai/gsm8k (downloads: needs network)")
    source.add_argument("--from-disk", help="a save_to_disk folder (DatasetDict) instead of the Hub")
    p.add_argument("--subset", default=None, help="the Hub set's config name, e.g. main")
    p.add_argument("--question", required=True, help="column with the question")
    p.add_argument("--answer", required=True, help="column with the answer or worked solution")
    p.add_argument("--answer-regex", default=None, help="regex whose group 1 is the final answer in --answer")
    p.add_argument("--data-source", default="my_dataset", help="data_source written into every row")
    p.add_argument("--out", required=True, help="output folder: one save_to_disk folder per split")
    args = p.parse_args(argv)

    import datasets

    if args.from_disk:
        raw = datasets.load_from_disk(args.from_disk)
    else:
        raw = datasets.load_dataset(args.dataset, args.subset)
    for split, rows in raw.items():
        mapped = datasets.Dataset.from_list([to_row(r, i, split, args) for i, r in enumerate(rows)])
        path = os.path.join(os.path.expanduser(args.out), split)
        mapped.save_to_disk(path)
        print(f"{split}: {len(mapped)} rows -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
