"""The CPUs a process may use (fusion_core/profiling/cpus.py): its affinity, fewer where
a cgroup's quota allows less CPU time, read from fake cgroup trees (v2 and v1, nested,
inside a container's namespace) against a stated affinity."""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autofusion.fusion_core.profiling import verdicts
from autofusion.fusion_core.profiling.cpus import usable_cpus


def _tree(root: Path, files: dict[str, str], own: str) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (root / "self_cgroup").write_text(own)
    return root / "self_cgroup"


@pytest.fixture
def eight_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))


@pytest.mark.usefixtures("eight_cpus")
def test_no_quota_counts_the_affinity(tmp_path: Path) -> None:
    own = _tree(tmp_path / "fs", {"cpu.max": "max 100000\n"}, "0::/\n")
    assert usable_cpus(tmp_path / "fs", own) == 8


@pytest.mark.usefixtures("eight_cpus")
def test_a_container_quota_rounds_up(tmp_path: Path) -> None:
    """``docker run --cpus 1.5``: the container's namespace sees its cgroup at ``/``."""
    own = _tree(tmp_path / "fs", {"cpu.max": "150000 100000\n"}, "0::/\n")
    assert usable_cpus(tmp_path / "fs", own) == 2


@pytest.mark.usefixtures("eight_cpus")
def test_the_lowest_quota_on_the_way_up_binds(tmp_path: Path) -> None:
    files = {
        "cpu.max": "max 100000",
        "kubepods/cpu.max": "300000 100000",
        "kubepods/pod1/cpu.max": "max 100000",
        "kubepods/pod1/box/cpu.max": "500000 100000",
    }
    own = _tree(tmp_path / "fs", files, "0::/kubepods/pod1/box\n")
    assert usable_cpus(tmp_path / "fs", own) == 3


@pytest.mark.usefixtures("eight_cpus")
def test_cgroup_v1_quota_and_period(tmp_path: Path) -> None:
    files = {"cpu,cpuacct/cpu.cfs_quota_us": "200000", "cpu,cpuacct/cpu.cfs_period_us": "100000"}
    own = _tree(tmp_path / "fs", files, "12:memory:/\n4:cpu,cpuacct:/\n0::/\n")
    assert usable_cpus(tmp_path / "fs", own) == 2


@pytest.mark.usefixtures("eight_cpus")
def test_v1_without_a_quota_and_unreadable_files_limit_nothing(tmp_path: Path) -> None:
    files = {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}
    own = _tree(tmp_path / "fs", files, "3:cpu:/\n")
    assert usable_cpus(tmp_path / "fs", own) == 8
    assert usable_cpus(tmp_path / "missing", tmp_path / "no_such_file") == 8


@given(
    affinity=st.integers(1, 64),
    quota=st.integers(1, 10_000_000),
    period=st.integers(1_000, 1_000_000),
)
def test_never_more_than_the_affinity_nor_the_quota(affinity: int, quota: int, period: int) -> None:
    """For any affinity and quota: the smaller of the two, the quota rounded up, >= 1."""

    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "sched_getaffinity", lambda pid: set(range(affinity)))
        root = Path(folder)
        own = _tree(root, {"cpu.max": f"{quota} {period}"}, "0::/\n")
        assert usable_cpus(root, own) == max(1, min(affinity, math.ceil(quota / period)))


def test_the_machine_class_counts_usable_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """A verdict's machine class is of what the process may use, not the host's count."""
    monkeypatch.setattr(verdicts, "usable_cpus", lambda: 3)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert verdicts.host_class()["cpus"] == 3
