"""Usable cores: the affinity mask capped by the cgroup CPU quota (v2 cpu.max, v1 cfs files), on fake trees."""

import os

import pytest

from sgl_moe.streaming.host_cpus import HostCpus, host_cpus, usable_cpus


def _tree(tmp_path, proc_line, files):
    root = tmp_path / "cg"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    root.mkdir(exist_ok=True)
    proc = tmp_path / "cgroup"
    proc.write_text(proc_line + "\n")
    return root, proc


@pytest.mark.parametrize("files,proc_line,quota", [
    ({"cpu.max": "max 100000\n"}, "0::/", None),
    ({"cpu.max": "150000 100000\n"}, "0::/", 1.5),
    ({"a/b/cpu.max": "max 100000\n", "a/cpu.max": "200000 100000\n"}, "0::/a/b", 2.0),  # a parent's cap
    ({"a/b/cpu.max": "50000 100000\n", "a/cpu.max": "400000 100000\n"}, "0::/a/b", 0.5),
    ({"cpu/x/cpu.cfs_quota_us": "300000\n", "cpu/x/cpu.cfs_period_us": "100000\n"}, "3:cpu,cpuacct:/x", 3.0),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, "3:cpu,cpuacct:/", None),
    ({"cpu.max": "garbage\n"}, "0::/", None),
])
def test_quota_is_read(tmp_path, files, proc_line, quota):
    root, proc = _tree(tmp_path, proc_line, files)
    got = host_cpus(root, proc)
    assert got.quota_cpus == quota
    assert got.affinity == len(os.sched_getaffinity(0))


def test_usable_is_affinity_capped_by_the_quota():
    assert HostCpus(os_cpu_count=192, affinity=16, quota_cpus=None, quota_source=None).usable == 16
    assert HostCpus(os_cpu_count=192, affinity=192, quota_cpus=15.5, quota_source="x").usable == 16
    assert HostCpus(os_cpu_count=192, affinity=8, quota_cpus=15.5, quota_source="x").usable == 8
    assert HostCpus(os_cpu_count=4, affinity=None, quota_cpus=0.2, quota_source="x").usable == 1
    assert HostCpus(os_cpu_count=None, affinity=None, quota_cpus=None, quota_source=None).usable == 1


def test_this_machine():
    n = usable_cpus()
    assert 1 <= n <= len(os.sched_getaffinity(0))
    assert host_cpus().as_dict()["usable"] == n
