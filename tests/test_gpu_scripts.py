"""The GPU scripts' parts that run without a GPU: the check's refusal, its plain PyTorch loop and its
results file's figures, and the GPU build's refusals. The build itself (minutes) and the check's
runs on a GPU are not run here: scripts/build-horovod-gpu.sh and scripts/check-gpu.sh, by hand."""
import importlib.util
import json
import os
import re
import subprocess

from conftest import BIN, ROOT

SCRIPTS = ROOT / "scripts"
spec = importlib.util.spec_from_file_location("check_gpu", SCRIPTS / "check_gpu.py")
check_gpu = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_gpu)


def test_check_gpu_without_a_gpu_stops_with_one_line():
    proc = subprocess.run(["bash", str(SCRIPTS / "check-gpu.sh")], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHON=str(BIN / "python"), CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("check-gpu.sh: no CUDA GPU visible"), proc.stderr


def test_plain_loop_trains_with_bf16_and_channels_last_on_the_cpu():
    proc = subprocess.run([str(BIN / "python"), str(SCRIPTS / "check_gpu.py"), "plain", "--model", "smallcnn",
                           "--amp", "bf16", "--channels-last", "--batch-size", "8", "--steps", "2", "--epochs", "2"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["device"] == "cpu" and len(result["images_per_s_per_epoch"]) == 2
    # the figure is the epochs after the first
    assert result["images_per_s"] == result["images_per_s_per_epoch"][1] > 0


def test_run_figures_are_the_epochs_after_the_first(tmp_path):
    lines = [{"epoch": 1, "images_per_s": 10.0, "test_acc": 0.5, "world_size": 2},
             {"epoch": 2, "images_per_s": 30.0, "test_acc": 0.8, "world_size": 2},
             {"epoch": 3, "images_per_s": 50.0, "test_acc": 0.9, "world_size": 2, "gpu_mem_peak_bytes": {"0": 5.0}}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (tmp_path / "eval.json").write_text(json.dumps({"test_acc": 0.91, "parameters_identical_across_ranks": True}))
    figures = check_gpu.read_run(tmp_path)
    assert figures["images_per_s"] == 40.0 and figures["epochs"] == 3
    assert figures["final_test_acc"] == 0.91 and figures["parameters_identical_across_ranks"] is True
    assert figures["gpu_mem_peak_bytes"] == {"0": 5.0}


def test_a_failed_run_keeps_hvd_cifars_own_error_line():
    text = ("Traceback (most recent call last):\n  ...\n[1,0]<stderr>:hvd_cifar: error: amp: bad value\n"
            "RuntimeError: something after it\n")
    assert check_gpu.last_error_line(text) == "[1,0]<stderr>:hvd_cifar: error: amp: bad value"
    assert check_gpu.last_error_line("a\nValueError: x\nb\n") == "ValueError: x"


def test_gpu_build_refuses_a_cuda_home_without_nvcc(tmp_path):
    proc = subprocess.run(["bash", str(SCRIPTS / "build-horovod-gpu.sh"), "--python", str(BIN / "python")],
                          capture_output=True, text=True, timeout=60, env=dict(os.environ, CUDA_HOME=str(tmp_path)))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == f"build-horovod-gpu.sh: CUDA_HOME={tmp_path} has no bin/nvcc"


def test_a_run_past_its_time_is_a_figure_not_a_crash():
    result, stdout = check_gpu.run(["bash", "-c", "echo started; sleep 5"], timeout=0.5)
    assert result["returncode"] is None and result["timed_out_after_s"] == 0.5
    assert result["error"] == "started" and stdout == "started\n"


def test_horovod_wheel_mode_builds_once_and_prints_the_wheel(tmp_path):
    """install.sh --horovod-wheel, with a stand-in Python whose `pip wheel` makes an empty wheel:
    the cache's folder is named by torch and Python, a second call builds nothing, and the
    mode ends with status 0 (its clean-up at exit once failed it after a good build)."""
    src = tmp_path / "horovod-0.28.1"
    src.mkdir()
    subprocess.run(["tar", "-czf", str(tmp_path / "horovod-0.28.1.tar.gz"), "-C", str(tmp_path), src.name], check=True)
    stand_in = tmp_path / "python"
    stand_in.write_text("""#!/bin/bash
case "$1" in
  -c) echo "9.8.7 311" ;;                      # the torch version and Python tag
  -) cat > /dev/null ;;                        # the fixes (read from stdin): nothing to patch
  -m) while [ "$1" != -w ]; do shift; done     # pip wheel ... -w DIR SRC
      mkdir -p "$2" && touch "$2/horovod-0.28.1-cp311-cp311-linux_x86_64.whl"
      echo built >> "$(dirname "$0")/builds" ;;
esac
""")
    stand_in.chmod(0o755)
    env = dict(os.environ, HVD_CIFAR_WHEEL_CACHE=str(tmp_path / "wheels"), HOROVOD_SDIST=str(src) + ".tar.gz")
    for _ in range(2):
        proc = subprocess.run(["bash", str(SCRIPTS / "install.sh"), "--horovod-wheel", str(stand_in), "-x"],
                              capture_output=True, text=True, timeout=60, env=env)
        assert proc.returncode == 0, proc.stderr
        assert re.fullmatch(rf"{tmp_path}/wheels/horovod-0\.28\.1-fixes\d+-torch9\.8\.7-py311-x/"
                            r"horovod-0\.28\.1-cp311-cp311-linux_x86_64\.whl\n", proc.stdout), proc.stdout
    assert (tmp_path / "builds").read_text() == "built\n"
