"""Security: checkpoints are data (never code), user input never reaches a shell, and the
Docker image's user is not root (tests/test_setup.py::test_dockerfile_recipe)."""
import re
import subprocess

import pytest
import torch

from conftest import PYTHON, ROOT, run_train

EVIL = """
import os, sys, torch

class Payload:
    def __reduce__(self):
        return (os.system, ("touch " + sys.argv[2],))

state = torch.load(sys.argv[1], weights_only=True)
state["optimizer"] = Payload()
torch.save(state, sys.argv[1])
"""


def test_a_checkpoint_carrying_code_is_refused_not_run(tmp_path, tiny_run):
    run, marker = tiny_run().copy_to(tmp_path), tmp_path / "pwned"  # a run of 2 epochs, checkpoint and all
    subprocess.run([PYTHON, "-c", EVIL, str(run / "checkpoint_last.pt"), str(marker)], check=True, cwd=ROOT)
    proc = run_train(["--resume", str(run), "--epochs", "3"], check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"hvd_cifar: error: resume: {run}/checkpoint_last.pt is not a readable checkpoint (UnpicklingError)"]
    assert not marker.exists()
    # the same file does run its payload when loaded the unsafe way: the test's evil is real
    torch.load(run / "checkpoint_last.pt", weights_only=False)
    assert marker.exists()


@pytest.mark.slow
@pytest.mark.parametrize("script", ["launch/horovodrun.sh", "launch/mpirun.sh"])
def test_shell_syntax_in_arguments_is_never_run(tmp_path, script):
    """Arguments pass as arrays from the launch scripts through the launcher to the trainer: a
    value holding shell syntax arrives as text and is rejected as a config value."""
    hostile = f"$(touch {tmp_path}/a);touch {tmp_path}/b`touch {tmp_path}/c`"
    args = ["-np", "2", *(["--gloo"] if "horovodrun" in script else ["--oversubscribe"])]
    proc = subprocess.run([str(ROOT / script), *args, "--config", "configs/tiny.yaml", "--model", hostile,
                           "--log-dir", str(tmp_path / "logs")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert f"model: '{hostile}' is not one of" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_no_shell_strings_in_launch_code():
    """Python launch code uses argument lists (no shell=True, os.system, os.popen); the shell
    scripts never eval or re-split their arguments."""
    for path in [*ROOT.glob("hvd_cifar/**/*.py"), *ROOT.glob("benchmarks/*.py")]:
        text = path.read_text()
        for pattern in (r"shell\s*=\s*True", r"os\.system\(", r"os\.popen\("):
            assert not re.search(pattern, text), f"{path.relative_to(ROOT)}: {pattern}"
    for path in ROOT.glob("launch/*.sh"):
        text = path.read_text()
        code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
        assert not re.search(r"\beval\b", code), path.name
        assert "$*" not in code and not re.search(r"(?<!\")\$@", code), f"{path.name}: unquoted $@ or $*"
