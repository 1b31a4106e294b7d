"""Horovod's own tuning keys (horovod_cycle_time_ms, horovod_fusion_threshold_mb,
horovod_hierarchical, horovod_autotune): validated in the config, and in the environment
Horovod reads at hvd.init() on real runs (in subprocesses: Horovod and MPI never start in the
pytest process), with the precedence config key > launcher's variable > hvd_cifar's default.
Bad values are in tests/test_config.py (test_bad_values_name_the_key)."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import PYTHON, run_train
from hvd_cifar.core import config, methods


def test_tuning_keys_default_to_someone_elses_setting_and_parse():
    assert all(getattr(config.Config(), key) is None for key in methods.METHODS["horovod"].settings)
    cfg = config.from_args(["--horovod-cycle-time-ms", "2.5", "--horovod-fusion-threshold-mb", "0",
                            "--horovod-hierarchical", "--no-horovod-autotune", "--no-tensorboard"])
    assert (cfg.horovod_cycle_time_ms, cfg.horovod_fusion_threshold_mb) == (2.5, 0.0)
    assert (cfg.horovod_hierarchical, cfg.horovod_autotune) == (True, False)
    cfg = config.from_args(["--horovod-cycle-time-ms", "7", "--horovod-cycle-time-ms", "null", "--no-tensorboard"])
    assert cfg.horovod_cycle_time_ms is None


def meta(tmp_path) -> dict:
    return json.loads((tmp_path / "logs" / "run" / "meta.json").read_text())


def test_a_key_beats_the_launchers_variable_which_beats_the_default(tiny_args, tmp_path):
    """One rank: meta.json's comm_settings are os.environ as Horovod was initialised with it."""
    launcher = {"HOROVOD_CYCLE_TIME": "9", "HOROVOD_FUSION_THRESHOLD": "1234", "HOROVOD_HIERARCHICAL_ALLREDUCE": "1"}
    run_train([*tiny_args, "--epochs", "1", "--max-steps-per-epoch", "2", "--no-tensorboard",
               "--horovod-cycle-time-ms", "3", "--no-horovod-hierarchical"], env=launcher)
    settings = meta(tmp_path)["comm_settings"]
    assert settings["HOROVOD_CYCLE_TIME"] == "3"  # the key, over the launcher's 9 (and the default 5)
    assert settings["HOROVOD_FUSION_THRESHOLD"] == "1234"  # no key: the launcher's
    assert settings["HOROVOD_HIERARCHICAL_ALLREDUCE"] == "0"  # an explicit false beats the launcher's 1
    assert "HOROVOD_AUTOTUNE" not in settings


def test_two_ranks_run_with_the_keys_and_keep_horovods_autotune_log(script_run):
    # 1 epoch of 4 steps by 2 ranks under horovodrun, --horovod-cycle-time-ms 7
    # --horovod-fusion-threshold-mb 16 --horovod-autotune true (conftest.SCRIPT_JOBS), started by
    # launch/horovodrun.sh: the job test_launch.py's hostfile test reads too
    run = script_run("launch/horovodrun.sh").run
    settings = json.loads((run / "meta.json").read_text())["comm_settings"]
    assert settings["HOROVOD_CYCLE_TIME"] == "7"
    assert settings["HOROVOD_FUSION_THRESHOLD"] == str(16 * 2**20)  # MiB, as horovodrun's --fusion-threshold-mb
    assert settings["HOROVOD_AUTOTUNE"] == "1"
    # Horovod's autotuner wrote its log (its own CSV header proves it read both variables at
    # hvd.init()); rank 0 copied it into the run folder and removed the temporary file.
    header = (run / "autotune.csv").read_text().splitlines()[0].split(",")
    assert {"cycle_time_ms", "tensor_fusion_threshold", "score"} <= set(header), header
    assert not os.path.exists(settings["HOROVOD_AUTOTUNE_LOG"])


def test_hierarchical_is_refused_where_horovod_has_none(tiny_args):
    """Horovod built without NCCL or DDL (this CPU build) turns hierarchical allreduce off at
    hvd.init() whatever it is told: asked for, it is one line and exit 2, not a silent no-op."""
    built = subprocess.run([PYTHON, "-c", "import horovod.torch as h; print(bool(h.nccl_built() or h.ddl_built()))"],
                           capture_output=True, text=True, check=True).stdout.strip()
    if built == "True":
        pytest.skip("this Horovod has a hierarchical allreduce")
    proc = run_train([*tiny_args, "--epochs", "1", "--no-tensorboard", "--horovod-hierarchical"], check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "horovod_hierarchical: this Horovod has no hierarchical allreduce" in proc.stderr, proc.stderr[-2000:]
