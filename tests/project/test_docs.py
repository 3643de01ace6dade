"""The docs say only what is true, as far as a test can tell: every repository path a page cites exists, the config
reference is the generator's output, and the pages issue 18 asked for are there."""

from __future__ import annotations

import glob
import os
import re

from tests.conftest import REPO_ROOT

PAGES = sorted(glob.glob(os.path.join(REPO_ROOT, "docs", "*.md"))) + [os.path.join(REPO_ROOT, "README.md")]
# `path/with/a/slash.ext` in backticks, or a markdown link to a .md page
_CITED = re.compile(r"`((?:npu_rl|kernels|configs|tests|scripts|examples|docs|docker)/[A-Za-z0-9_./-]+)`")
_LINK = re.compile(r"\]\(([A-Za-z0-9_./-]+\.md)\)")


def test_every_cited_path_exists():
    missing = []
    for page in PAGES:
        text = open(page, encoding="utf-8").read()
        for match in _CITED.finditer(text):
            path = match.group(1).rstrip(".")
            if "*" in path or "<" in path or "verl's" in text[max(0, match.start() - 8):match.start()]:
                continue  # a pattern, a placeholder, or a file of verl's repository
            if not os.path.exists(os.path.join(REPO_ROOT, path)):
                missing.append(f"{os.path.relpath(page, REPO_ROOT)}: {path}")
        for link in _LINK.findall(text):
            if not os.path.exists(os.path.join(os.path.dirname(page), link)):
                missing.append(f"{os.path.relpath(page, REPO_ROOT)}: link {link}")
    assert not missing, "\n".join(missing)


def test_config_keys_is_generated_from_the_schema():
    from npu_rl.config.key_docs import markdown, walk

    with open(os.path.join(REPO_ROOT, "docs", "config_keys.md"), encoding="utf-8") as f:
        assert f.read() == markdown(), "regenerate: python -m npu_rl.config.key_docs > docs/config_keys.md"
    keys = {row[0] for row in walk()}
    assert {"data.train_files", "actor_rollout_ref.actor.optim.lr", "trainer.logger", "algorithm.adv_estimator"} <= keys


def test_the_pages_exist():
    for page in ("tracking.md", "config_keys.md", "byo_dataset.md", "troubleshooting.md"):
        assert os.path.getsize(os.path.join(REPO_ROOT, "docs", page)) > 1000, page
