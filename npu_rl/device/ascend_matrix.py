"""vLLM-Ascend's published release compatibility matrix, as data, and facts about its releases that matter for RL.

Source: vllm-ascend ``docs/source/community/versioning_policy.md``, "Release compatibility matrix" (the copy in the
v0.30.0rc2 sdist, rows v0.7.3 .. v0.30.0rc1; the v0.24.0rc1 row from that tag's copy, which later copies dropped). Columns: vLLM-Ascend, the vLLM it is
built for (vLLM-Ascend's wheels do not declare that pin: it is checked from this table), Python, CANN, torch,
torch_npu, triton-ascend (None: the table says N/A; releases before v0.13.0 did not pin one).

Per-release facts read from the vllm-ascend sources (tags in the mirror) and from the wheels
(tests/device/test_real_packages.py re-checks them):

- ``numpy<2.0.0`` is required through v0.19.1rc1 (requirements.txt); from v0.20.2rc1 numpy is unpinned.
- ``NPUWorker.reload_weights`` exists from v0.24.0rc1 (forwards to the runner, which takes ``weights_iterator``).
- ``NPUModelRunner`` builds ``AscendSampler()`` without the engine's ``logprobs_mode`` in every release checked,
  through v0.30.0rc2: rollout log-probs are the raw ones whatever ``logprobs_mode`` asks.
- NZ weights: ``NPUWorker.wake_up`` raises ``ValueError`` while NZ is on (v0.11.0+). Before v0.20.2rc1 only the
  variable ``VLLM_ASCEND_ENABLE_NZ`` (default 1) decides; v0.20.2rc1-v0.26.0rc1 read ``additional_config.
  weight_nz_mode`` first and fall back to the variable; from v0.27.1rc1 the variable is gone and
  ``AscendConfig.weight_nz_mode`` (default 1) alone decides.
- ``additional_config.enable_cpu_binding`` defaults to True from v0.19.1rc1 (``taskset`` of the whole process).
- Every wheel from v0.13.0 requires ``arctic-inference==0.1.1`` (sdist only on PyPI); PyPI's wheels are A2 builds
  and ``NPUWorker.__init__`` asserts the SoC, so an A3 node needs the vendor's wheels or an ``-a3`` image.

Releases not in the matrix (:func:`match_release`): a post / rc / dev release of a row's version takes that row
(nearest: same release number, the newest row not newer than it); a release newer than the newest row takes the
newest row and is marked ``checked=False`` (npu-rl runs and says so) instead of being refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

MATRIX_SOURCE = ("vllm-project/vllm-ascend docs/source/community/versioning_policy.md, release compatibility matrix "
                 "(the v0.30.0rc2 sdist's copy + v0.24.0rc1)")


@dataclass(frozen=True)
class AscendRelease:
    vllm_ascend: str
    vllm: tuple[str, ...]
    python: str  # a PEP 440 specifier
    cann: str
    torch: str
    torch_npu: str
    triton_ascend: str | None


_R = AscendRelease
MATRIX: tuple[AscendRelease, ...] = (
    _R("0.30.0rc1", ("0.30.0",), ">=3.10,<3.13", "9.2.0", "2.10.0", "2.10.0.post4", "3.2.2"),
    _R("0.26.0rc1", ("0.26.0",), ">=3.10,<3.13", "9.1.0", "2.10.0", "2.10.0.post4", "3.2.2"),
    _R("0.24.0rc1", ("0.24.0",), ">=3.10,<3.13", "9.0.1", "2.10.0", "2.10.0.post2", "3.2.1"),
    _R("0.23.0.post1", ("0.23.0",), ">=3.10,<3.13", "9.1.0", "2.10.0", "2.10.0.post4", "3.2.2"),
    _R("0.23.0", ("0.23.0",), ">=3.10,<3.13", "9.1.0", "2.10.0", "2.10.0.post4", "3.2.2"),
    _R("0.23.0rc1", ("0.23.0",), ">=3.10,<3.13", "9.0.1", "2.10.0", "2.10.0.post2", "3.2.1"),
    _R("0.22.1rc1", ("0.22.1",), ">=3.10,<3.13", "9.0.0", "2.10.0", "2.10.0", "3.2.1"),
    _R("0.21.0rc1", ("0.21.0",), ">=3.10,<3.13", "9.0.0", "2.10.0", "2.10.0", "3.2.1"),
    _R("0.20.2rc1", ("0.20.2",), ">=3.10,<3.12", "9.0.0", "2.10.0", "2.10.0", "3.2.1"),
    _R("0.19.1rc1", ("0.19.1",), ">=3.10,<3.12", "8.5.1", "2.9.0", "2.9.0", "3.2.0"),
    _R("0.18.0", ("0.18.0",), ">=3.10,<3.12", "8.5.1", "2.9.0", "2.9.0.post1+git4c901a4", "3.2.0.dev20260322"),
    _R("0.18.0rc1", ("0.18.0",), ">=3.10,<3.12", "8.5.1", "2.9.0", "2.9.0", "3.2.0"),
    _R("0.17.0rc1", ("0.17.0",), ">=3.10,<3.12", "8.5.1", "2.9.0", "2.9.0", "3.2.0"),
    _R("0.16.0rc1", ("0.16.0",), ">=3.10,<3.12", "8.5.1", "2.9.0", "2.9.0", "3.2.0"),
    _R("0.15.0rc1", ("0.15.0",), ">=3.10,<3.12", "8.5.0", "2.9.0", "2.9.0", "3.2.0"),
    _R("0.14.0rc1", ("0.14.1",), ">=3.10,<3.12", "8.5.0", "2.9.0", "2.9.0", "3.2.0"),
    _R("0.13.0rc3", ("0.13.0",), ">=3.10,<3.12", "8.5.1", "2.8.0", "2.8.0.post2", "3.2.0"),
    _R("0.13.0", ("0.13.0",), ">=3.10,<3.12", "8.5.0", "2.8.0", "2.8.0.post2", "3.2.0"),
    _R("0.13.0rc2", ("0.13.0",), ">=3.10,<3.12", "8.5.0", "2.8.0", "2.8.0.post1", "3.2.0"),
    _R("0.13.0rc1", ("0.13.0",), ">=3.10,<3.12", "8.3.RC2", "2.8.0", "2.8.0", None),
    _R("0.12.0rc1", ("0.12.0",), ">=3.10,<3.12", "8.3.RC2", "2.8.0", "2.8.0", None),
    _R("0.11.0", ("0.11.0",), ">=3.9,<3.12", "8.3.RC2", "2.7.1", "2.7.1.post1", None),
    _R("0.11.0rc3", ("0.11.0",), ">=3.9,<3.12", "8.3.RC2", "2.7.1", "2.7.1.post1", None),
    _R("0.11.0rc2", ("0.11.0",), ">=3.9,<3.12", "8.3.RC2", "2.7.1", "2.7.1", None),
    _R("0.11.0rc1", ("0.11.0",), ">=3.9,<3.12", "8.3.RC1", "2.7.1", "2.7.1", None),
    _R("0.11.0rc0", ("0.11.0rc3",), ">=3.9,<3.12", "8.2.RC1", "2.7.1", "2.7.1.dev20250724", None),
    _R("0.10.2rc1", ("0.10.2",), ">=3.9,<3.12", "8.2.RC1", "2.7.1", "2.7.1.dev20250724", None),
    _R("0.10.1rc1", ("0.10.1", "0.10.1.1"), ">=3.9,<3.12", "8.2.RC1", "2.7.1", "2.7.1.dev20250724", None),
    _R("0.10.0rc1", ("0.10.0",), ">=3.9,<3.12", "8.2.RC1", "2.7.1", "2.7.1.dev20250724", None),
    _R("0.9.2rc1", ("0.9.2",), ">=3.9,<3.12", "8.1.RC1", "2.5.1", "2.5.1.post1.dev20250619", None),
    _R("0.9.1", ("0.9.1",), ">=3.9,<3.12", "8.2.RC1", "2.5.1", "2.5.1.post1", None),
    _R("0.9.1rc3", ("0.9.1",), ">=3.9,<3.12", "8.2.RC1", "2.5.1", "2.5.1.post1", None),
    _R("0.9.1rc2", ("0.9.1",), ">=3.9,<3.12", "8.2.RC1", "2.5.1", "2.5.1.post1", None),
    _R("0.9.1rc1", ("0.9.1",), ">=3.9,<3.12", "8.1.RC1", "2.5.1", "2.5.1.post1.dev20250528", None),
    _R("0.9.0rc2", ("0.9.0",), ">=3.9,<3.12", "8.1.RC1", "2.5.1", "2.5.1", None),
    _R("0.9.0rc1", ("0.9.0",), ">=3.9,<3.12", "8.1.RC1", "2.5.1", "2.5.1", None),
    _R("0.8.5rc1", ("0.8.5.post1",), ">=3.9,<3.12", "8.1.RC1", "2.5.1", "2.5.1", None),
    _R("0.8.4rc2", ("0.8.4",), ">=3.9,<3.12", "8.0.0", "2.5.1", "2.5.1", None),
    _R("0.7.3.post1", ("0.7.3",), ">=3.9,<3.12", "8.1.RC1", "2.5.1", "2.5.1", None),
    _R("0.7.3", ("0.7.3",), ">=3.9,<3.12", "8.1.RC1", "2.5.1", "2.5.1", None),
)

NUMPY_BELOW_2_UNTIL = "0.19.1rc1"  # the last release whose requirements.txt says numpy<2.0.0
RELOAD_WEIGHTS_SINCE = "0.24.0rc1"  # NPUWorker.reload_weights(weights_iterator=...) via its runner
LOGPROBS_MODE_IGNORED_THROUGH = "0.30.0rc2"  # AscendSampler() built without logprobs_mode (newest checked)
NZ_KEY_SINCE = "0.20.2rc1"  # additional_config.weight_nz_mode read (before: the variable alone)
NZ_VARIABLE_GONE_FROM = "0.27.1rc1"  # VLLM_ASCEND_ENABLE_NZ no longer read
CPU_BINDING_DEFAULT_ON_SINCE = "0.19.1rc1"  # additional_config.enable_cpu_binding defaults to True
ARCTIC_INFERENCE_SINCE = "0.13.0"  # wheels require arctic-inference==0.1.1 (no wheel of it on PyPI)


def parse(version: str | None) -> Version | None:
    """PEP 440 version of a package version string ('0.11.0rc1', '2.7.1.post1+git123', 'v0.9.1'), local part
    dropped; None when it is not one."""
    if not version:
        return None
    try:
        return Version(Version(version.strip().lstrip("vV")).public)
    except InvalidVersion:
        return None


def same_release(a: str | None, b: str | None) -> bool:
    """Same major.minor.patch (post, dev, rc and local parts ignored): '2.7.1.post1' ~ '2.7.1'."""
    va, vb = parse(a), parse(b)
    return va is not None and vb is not None and (va.release + (0, 0, 0))[:3] == (vb.release + (0, 0, 0))[:3]


def release_for(vllm_ascend_version: str | None) -> AscendRelease | None:
    """The matrix row of an installed vLLM-Ascend (exact version, local part ignored), or None."""
    wanted = parse(vllm_ascend_version)
    if wanted is None:
        return None
    for row in MATRIX:
        if parse(row.vllm_ascend) == wanted:
            return row
    return None


@dataclass(frozen=True)
class ReleaseMatch:
    row: AscendRelease
    checked: bool  # False: a release newer than the matrix, run with its newest row's versions
    note: str = ""  # how the row was chosen when it is not the exact version


def match_release(vllm_ascend_version: str | None) -> ReleaseMatch | None:
    """The row an installed vLLM-Ascend runs with: the exact row; else the newest row of the same release number
    not newer than it (0.23.0.post2 -> 0.23.0.post1, 0.26.0rc2 -> 0.26.0rc1, 0.30.0.dev5 -> the newest 0.30.0 row);
    else, for a release newer than every row, the newest row with ``checked=False``; None for an unparsable
    version or one older than the matrix with no row of its release number."""
    wanted = parse(vllm_ascend_version)
    if wanted is None:
        return None
    exact = release_for(vllm_ascend_version)
    if exact is not None:
        return ReleaseMatch(exact, True)
    same = [row for row in MATRIX if same_release(row.vllm_ascend, str(wanted))]
    if same:
        older = [row for row in same if parse(row.vllm_ascend) <= wanted]
        row = max(older or same, key=lambda r: parse(r.vllm_ascend))
        return ReleaseMatch(row, True, f"vllm-ascend {vllm_ascend_version} is not in the matrix; using the row of "
                                       f"{row.vllm_ascend} (same release)")
    newest = max(MATRIX, key=lambda r: parse(r.vllm_ascend))
    if wanted > parse(newest.vllm_ascend):
        return ReleaseMatch(newest, False, f"vllm-ascend {vllm_ascend_version} is newer than npu-rl's matrix "
                                           f"(newest row {newest.vllm_ascend}): not checked; running with that "
                                           "row's versions")
    return None


def reads_nz_key(vllm_ascend_version: str | None) -> bool:
    """additional_config.weight_nz_mode is read (unknown versions: assume a current release)."""
    v = parse(vllm_ascend_version)
    return v is None or v >= Version(NZ_KEY_SINCE)


def reads_nz_variable(vllm_ascend_version: str | None) -> bool:
    """VLLM_ASCEND_ENABLE_NZ is still read (alone or as the fallback; unknown versions: maybe)."""
    v = parse(vllm_ascend_version)
    return v is None or v < Version(NZ_VARIABLE_GONE_FROM)


def _at_most(version: str | None, bound: str) -> bool:
    v = parse(version)
    return v is not None and v <= Version(bound)


def needs_numpy_below_2(vllm_ascend_version: str | None) -> bool:
    return _at_most(vllm_ascend_version, NUMPY_BELOW_2_UNTIL)


def has_reload_weights(vllm_ascend_version: str | None) -> bool:
    v = parse(vllm_ascend_version)
    return v is not None and v >= Version(RELOAD_WEIGHTS_SINCE)


def ignores_logprobs_mode(vllm_ascend_version: str | None) -> bool:
    return _at_most(vllm_ascend_version, LOGPROBS_MODE_IGNORED_THROUGH)


def cann_matches(found: str | None, expected: str) -> bool:
    """CANN versions are not PEP 440 ('8.3.RC1', '8.5.0', version.cfg's '8.3.RC1.alpha002'): compare the leading
    dotted fields of the expected version, case-insensitively."""
    if not found:
        return False
    want = expected.lower().split(".")
    return found.strip().lower().split(".")[: len(want)] == want
