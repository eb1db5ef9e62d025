"""Every `cuda/tests/*_host.cu` compiled by nvcc and run on the host (no GPU needed).
Where nvcc is absent these are skipped, except under STRATA_REQUIRE_KERNELS=1 (CI), where a
missing nvcc fails them."""

from __future__ import annotations

import os

import pytest
from cuda_host import find_nvcc, host_checks, run_host_check


@pytest.mark.parametrize("name", host_checks())
def test_host_check(name: str) -> None:
    if find_nvcc() is None:
        if os.environ.get("STRATA_REQUIRE_KERNELS") == "1":
            pytest.fail("STRATA_REQUIRE_KERNELS=1 but nvcc is not found")
        pytest.skip("nvcc not found (install cuda-toolkit[nvcc,cudart,cccl] or set STRATA_NVCC)")
    res = run_host_check(name)
    print(res.stdout)
    assert res.returncode == 0, f"{name}_host failed:\n{res.stdout}{res.stderr}"


def test_there_is_a_host_check() -> None:
    assert "smoke" in host_checks()
