"""Peak host memory per rank of the sharded load against the plain one, on a Qwen2.5-0.5B-width model over 2 gloo
ranks (tens of seconds; the sharded load's equality tests are in tests/parallel/test_sharded_load.py)."""

from __future__ import annotations

from tests.parallel.dist_pool import DistPool
from tests.parallel.test_sharded_load import _param_counts, memory_job, qwen05b_width_config, save_sharded


def test_host_memory_per_rank(tmp_path):
    """Each rank's peak resident memory: near its share with the sharded load, about the whole model and more
    with the plain one. Numbers printed for docs/distributed.md."""
    folder = save_sharded(str(tmp_path / "qwen05b_width"), qwen05b_width_config(), max_shard_size="200MB")
    num_params = sum(v for v in _param_counts(folder).values())
    full_fp32_mib = num_params * 4 / 2**20
    largest_bf16_mib = max(_param_counts(folder).values()) * 2 / 2**20
    pool = DistPool(2, timeout_s=600)
    try:
        results = pool.run(memory_job, folder)
    finally:
        pool.close()
    for r in results:
        print(f"rank {r['rank']}: sharded peak +{r['sharded_mib']:.0f} MiB, plain peak +{r['plain_mib']:.0f} MiB, "
              f"share {r['local_mib']:.0f} MiB, whole model fp32 {full_fp32_mib:.0f} MiB")
        assert r["same"]
        # its share, plus at most one tensor's slice in the file's dtype (read, then cast) and slack
        assert r["sharded_mib"] <= full_fp32_mib / 2 + largest_bf16_mib + 128, r
        assert r["plain_mib"] >= full_fp32_mib, r  # the whole model (and more) on every rank
        assert r["sharded_mib"] < 0.6 * r["plain_mib"], r
