"""scripts/check-pythons.sh, the proof that each supported Python works end to end (the table in
docs/INSTALL.md, "Python versions"). Its passing runs build a venv and horovod per version
(minutes each), so CI runs only its refusals: a version install.sh does not support, or cannot
find, must fail the check with a row naming the reason, never pass it."""
import os
import subprocess

from conftest import ROOT


def test_check_pythons_fails_a_version_it_cannot_install(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3.10"  # answers every -c with its version, as a real 3.10 would
    fake.write_text("#!/bin/sh\necho 3.10\n")
    fake.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "CHECK_PYTHONS_LOG_DIR": str(tmp_path / "out")}
    proc = subprocess.run(["bash", "scripts/check-pythons.sh", "3.10", "3.99"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| 3.")]
    assert len(rows) == 2, proc.stdout
    assert "FAIL" in rows[0] and "Python 3.10; hvd_cifar supports 3.11, 3.12 and 3.13" in rows[0], rows[0]
    assert "FAIL" in rows[1] and "python3.99 not found" in rows[1], rows[1]
    assert not os.path.exists(ROOT / ".venv-3.10")
