"""harness.provenance: git state, host, packages, and the comparability key with its parts."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from harness import provenance
from store_fixtures import make_cell

PARAMS = make_cell().params()
PROV = {"target_hash": "t1", "draft_hash": "d1", "dataset_hash": "s1", "backend_version": "inhouse-0", "device": "cpu"}
PACKAGES = {"python": "3.11.7", "torch": "2.13.0", "transformers": "5.0", "duckdb": "2.0.1", "numpy": "2.4"}


def test_git_info_outside_a_checkout(tmp_path):
    assert provenance.git_info(tmp_path) == (None, None, None)
    assert provenance.git_info(tmp_path / "does-not-exist") == (None, None, None)


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_git_info_of_a_checkout(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q", "-b", "trunk")
    (tmp_path / "a.txt").write_text("1")
    git("add", "a.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    sha, branch, dirty = provenance.git_info(tmp_path)
    assert len(sha) == 40 and branch == "trunk" and dirty is False
    (tmp_path / "untracked.txt").write_text("x")
    assert provenance.git_info(tmp_path)[2] is False  # untracked files do not count
    (tmp_path / "a.txt").write_text("2")
    assert provenance.git_info(tmp_path)[2] is True
    git("checkout", "-q", "--detach")
    assert provenance.git_info(tmp_path)[1] is None


def test_host_info_and_fingerprint():
    host = provenance.host_info()
    assert {"cpu_model", "cores", "memory_bytes", "gpus", "driver", "cuda", "platform", "hostname"} <= set(host)
    assert host["cores"] >= 1 and isinstance(host["gpus"], list)
    fp = provenance.host_fingerprint(host)
    assert len(fp) == 12 and fp == provenance.host_fingerprint(dict(host))
    assert provenance.host_fingerprint({**host, "hostname": "elsewhere", "memory_bytes": 1}) == fp
    assert provenance.host_fingerprint({**host, "cores": host["cores"] + 1}) != fp
    assert provenance.host_fingerprint({**host, "gpus": ["NVIDIA H200"]}) != fp


def test_package_versions():
    versions = provenance.package_versions()
    assert versions["python"] and versions["duckdb"] and versions["numpy"]
    assert set(versions) <= {"python", *provenance.PACKAGES}


def test_comparability_key_and_parts():
    key = provenance.comparability_key(PARAMS, PROV, "fp", PACKAGES)
    assert len(key) == 16 and key == provenance.comparability_key(dict(PARAMS), dict(PROV), "fp", dict(PACKAGES))
    parts = provenance.comparability_parts(PARAMS, PROV, "fp", PACKAGES)
    assert parts["packages"] == {"torch": "2.13.0", "transformers": "5.0"}
    assert parts["provenance"] == {"target_hash": "t1", "draft_hash": "d1", "dataset_hash": "s1",
                                   "backend_version": "inhouse-0"}
    assert parts["host"] == "fp" and parts["params"] == PARAMS

    # Each part moves the key; what does not change a measurement does not.
    assert provenance.comparability_key(PARAMS, PROV, "other", PACKAGES) != key
    assert provenance.comparability_key(PARAMS, PROV, "fp", {**PACKAGES, "torch": "2.14.0"}) != key
    assert provenance.comparability_key(PARAMS, PROV, "fp", {**PACKAGES, "vllm": "0.11"}) != key
    assert provenance.comparability_key(PARAMS, {**PROV, "draft_hash": "d2"}, "fp", PACKAGES) != key
    assert provenance.comparability_key(make_cell(seed=1).params(), PROV, "fp", PACKAGES) != key
    assert provenance.comparability_key(PARAMS, PROV, "fp", {**PACKAGES, "duckdb": "9", "numpy": "9"}) == key
    assert provenance.comparability_key(PARAMS, {**PROV, "device": "cuda:1"}, "fp", PACKAGES) == key
