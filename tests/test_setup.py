"""The set-up recipe: the install script (which the Dockerfile runs) and the Dockerfile itself."""
import os
import re
import shutil
import subprocess
import time

import pytest

from conftest import BIN, ROOT

DOCKERFILE = (ROOT / "Dockerfile").read_text()


def test_install_script_is_idempotent_and_fast_the_second_time():
    start = time.monotonic()
    proc = subprocess.run(["bash", "scripts/install.sh"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, VENV=str(BIN.parent)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert time.monotonic() - start < 60
    assert "ready" in proc.stdout


def test_horovod_build_has_pytorch_mpi_and_gloo():
    out = subprocess.run([str(BIN / "horovodrun"), "--check-build"], capture_output=True, text=True,
                         timeout=120).stdout
    for feature in ("PyTorch", "MPI", "Gloo"):
        assert re.search(rf"\[X\] {feature}", out), out


def test_install_script_explains_each_horovod_fix():
    script = (ROOT / "scripts" / "install.sh").read_text()
    for fix in ("Fix 1", "Fix 2", "Fix 3"):
        assert fix in script
    assert "CMAKE_CXX_STANDARD 17" in script and "HOROVOD_GPU_OPERATIONS" in script
    assert "--no-build-isolation" in script


def test_dockerfile_lints_clean():
    hadolint = shutil.which("hadolint", path=str(BIN))
    if hadolint is None:
        pytest.skip("hadolint not installed")
    proc = subprocess.run([hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout


def test_dockerfile_recipe():
    # pinned base, a build argument for a CUDA base and the GPU build
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11\.\d+-slim-bookworm$", DOCKERFILE, re.M)
    assert "ARG HOROVOD_GPU_OPERATIONS" in DOCKERFILE and "nvidia/cuda:" in DOCKERFILE
    # the same install script CI runs, and a build-time horovod check
    assert "bash scripts/install.sh" in DOCKERFILE and "horovodrun --check-build" in DOCKERFILE
    # ends as an unprivileged user
    users = re.findall(r"^USER (\S+)", DOCKERFILE, re.M)
    assert users and users[-1] not in ("root", "0")
    # every file the image copies exists
    for src in re.findall(r"^COPY (\S+)", DOCKERFILE, re.M):
        assert (ROOT / src).exists(), src
