import subprocess

import pytest
import yaml

from conftest import PYTHON, ROOT
from hvd_cifar.core import config
from hvd_cifar.core.config import Config, ConfigError


def test_precedence_defaults_yaml_flags(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("batch_size: 16\nlr: 0.2\nmodel: smallcnn\n")
    cfg = config.from_args(["--config", str(path), "--batch-size", "64"])
    assert cfg.batch_size == 64            # flag beats YAML
    assert cfg.lr == 0.2                   # YAML beats default
    assert cfg.model == "smallcnn"
    assert cfg.epochs == Config().epochs   # default kept


@pytest.mark.parametrize("argv, expected", [
    (["--fp16-allreduce"], True),
    (["--no-fp16-allreduce"], False),
    (["--fp16-allreduce", "true"], True),
    (["--fp16-allreduce", "false"], False),
    (["--fp16-allreduce=true"], True),
])
def test_boolean_flag_forms(argv, expected):
    assert config.from_args(argv).fp16_allreduce is expected


def test_flag_values_are_typed():
    cfg = config.from_args(["--lr", "1", "--freeze-schedule", "{0: 0, 3: 2}", "--run-name", "2024",
                            "--warmup-epochs", "0"])
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float)
    assert cfg.freeze_schedule == {0: 0, 3: 2}
    assert cfg.run_name == "2024"          # a string key keeps its text
    from hvd_cifar.trainer.freezing import FreezeSettings
    assert FreezeSettings.of(cfg).frozen_blocks(0) == 0 and FreezeSettings.of(cfg).frozen_blocks(5) == 2


@pytest.mark.parametrize("argv, key", [
    (["--bacth-size", "4"], "bacth_size"),
    (["--batch-size", "four"], "batch_size"),
    (["--epochs", "1.5"], "epochs"),
    (["--lr", "-0.1"], "lr"),
    (["--batch-size", "0"], "batch_size"),
    (["--accumulation-steps", "0"], "accumulation_steps"),
    (["--model", "alexnet"], "model"),
    (["--dataset", "mnist"], "dataset"),
    (["--sync", "carrier-pigeon"], "sync"),
    (["--schedule", "linear"], "schedule"),
    (["--amp", "fp8"], "amp"),
    (["--nesterov", "maybe"], "nesterov"),
    (["--label-smoothing", "1.0"], "label_smoothing"),
    (["--freeze", "-1"], "freeze"),
    (["--epochs"], "epochs"),
    (["--run-name", "a/b"], "run_name"),
    (["--freeze-schedule", "{1:1}"], "freeze_schedule"),
    (["--freeze-schedule", "{1: -2}"], "freeze_schedule"),
    (["--horovod-cycle-time-ms", "0"], "horovod_cycle_time_ms"),
    (["--horovod-cycle-time-ms", "fast"], "horovod_cycle_time_ms"),
    (["--horovod-fusion-threshold-mb", "-1"], "horovod_fusion_threshold_mb"),
    (["--horovod-hierarchical", "2"], "horovod_hierarchical"),
    (["--horovod-autotune", "often"], "horovod_autotune"),
    (["--compression", "zip"], "compression"),
    (["--compression", "powersgd", "--fp16-allreduce"], "fp16_allreduce"),  # two settings that disagree
    (["--powersgd-rank", "0"], "powersgd_rank"),
    (["--topk-fraction", "0"], "topk_fraction"),
    (["--topk-fraction", "1.5"], "topk_fraction"),
    (["--compression-warmup-steps", "-1"], "compression_warmup_steps"),
    (["--local-sgd-steps", "0"], "local_sgd_steps"),
    (["--local-sgd-steps", "4", "--compression", "topk"], "local_sgd_steps"),
    (["--local-sgd-steps", "4", "--fp16-allreduce"], "local_sgd_steps"),
    (["--sync", "mpi-allreduce", "--compression", "powersgd"], "compression"),  # horovod and ddp only
    (["--sync", "mpi-async-ps", "--local-sgd-steps", "2"], "local_sgd_steps"),
    (["--compression", "topk", "--comm-timeline"], "compression"),
    (["--compression", "topk", "--elastic"], "compression"),
    (["--compression", "powersgd", "--amp", "fp16"], "compression"),
    (["--sync", "ddp", "--local-sgd-steps", "2", "--freeze", "auto"], "local_sgd_steps"),
])
def test_bad_values_name_the_key(argv, key):
    with pytest.raises(ConfigError) as err:
        config.from_args(argv)
    message = str(err.value)
    assert message.startswith(key) and "\n" not in message


@pytest.mark.parametrize("argv, compression", [
    ([], "none"), (["--fp16-allreduce"], "fp16"), (["--compression", "fp16"], "fp16"),
    (["--compression", "fp16", "--fp16-allreduce"], "fp16"), (["--compression", "topk"], "topk"),
])
def test_fp16_allreduce_and_compression_fp16_are_one_setting(argv, compression):
    cfg = config.from_args(argv)
    assert cfg.compression == compression and cfg.fp16_allreduce == (compression == "fp16")


def test_schemes_run_under_horovod_and_ddp():
    """Accepted under the two methods that run a scheme, as asked (with accumulation; local SGD
    with amp fp16, which keeps no residual), and refused under one that does not."""
    for sync in ("horovod", "ddp"):
        cfg = config.from_args(["--sync", sync, "--compression", "powersgd", "--accumulation-steps", "2"])
        assert (cfg.sync, cfg.compression, cfg.accumulation_steps) == (sync, "powersgd", 2)
        cfg = config.from_args(["--sync", sync, "--local-sgd-steps", "4", "--amp", "fp16"])
        assert (cfg.sync, cfg.local_sgd_steps, cfg.amp, cfg.compression) == (sync, 4, "fp16", "none")
    with pytest.raises(ConfigError, match="compression: powersgd: needs sync: horovod or ddp"):
        config.from_args(["--sync", "mpi-allreduce", "--compression", "powersgd"])


def test_yaml_unknown_key_and_type(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("epochz: 3\n")
    with pytest.raises(ConfigError, match="epochz: unknown config key .*'epochs'"):
        config.from_args(["--config", str(path)])
    path.write_text("epochs: three\n")
    with pytest.raises(ConfigError, match="epochs: expected int"):
        config.from_args(["--config", str(path)])


def test_saved_config_round_trips(tmp_path):
    cfg = config.from_args(["--model", "resnet18", "--freeze-schedule", "{2: 1}", "--amp", "bf16"])
    cfg.save(tmp_path / "config.yaml")
    again = config.from_args(["--config", str(tmp_path / "config.yaml")])
    assert again == cfg


def test_shipped_configs_are_valid():
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        config.from_args(["--config", str(path)])
        assert set(yaml.safe_load(path.read_text())) <= set(config.FIELDS)


def test_cli_bad_key_is_one_line_and_exit_2():
    proc = subprocess.run([PYTHON, "-m", "hvd_cifar.train", "--batch-sise", "8"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "hvd_cifar: error: batch_sise: unknown config key (did you mean 'batch_size'?)"]


def test_exponent_numbers_are_floats_and_non_finite_ones_are_refused(tmp_path):
    """YAML 1.1 reads 1e30 and 5e-4 as strings; as a flag or in a file they are numbers."""
    assert config.from_args(["--lr", "1e30"]).lr == 1e30
    path = tmp_path / "c.yaml"
    path.write_text("weight_decay: 5e-4\n")
    assert config.from_args(["--config", str(path)]).weight_decay == 5e-4
    for bad in ("nan", ".inf", "inf"):
        with pytest.raises(ConfigError, match="grad_clip: must be a finite number"):
            config.from_args(["--grad-clip", bad])
    with pytest.raises(ConfigError, match="lr_scaling: 'cubic' is not one of linear, sqrt, none"):
        config.from_args(["--lr-scaling", "cubic"])
    with pytest.raises(ConfigError, match="target_acc: must be in"):
        config.from_args(["--target-acc", "95"])


def test_threads_per_rank_may_use_the_usable_cpus_and_no_more(monkeypatch):
    """An error, not a clamp (config.check_host says why); the bound is the CPUs this process
    may run on, which may be fewer than the machine's."""
    monkeypatch.setattr(config, "usable_cpus", lambda: 3)
    assert config.from_args(["--threads-per-rank", "3"]).threads_per_rank == 3
    assert config.from_args([]).threads_per_rank == 0
    with pytest.raises(ConfigError, match=r"^threads_per_rank: 4 is more than the 3 CPUs this process may use on "):
        config.from_args(["--threads-per-rank", "4"])


def test_a_nic_the_host_lacks_is_refused_with_the_hosts_interfaces(monkeypatch):
    from hvd_cifar.trainer import netstats

    monkeypatch.setattr(netstats, "read_counters", lambda: {"lo": (0, 0), "ens3": (5, 7)})
    assert config.from_args(["--nic", "ens3"]).nic == "ens3"
    netstats.check_interface("ens3")
    with pytest.raises(ConfigError, match=r"^nic: 'eth0' is not a network interface of .* \(it has: ens3, lo\)"):
        netstats.check_interface("eth0")
    with pytest.raises(ConfigError, match=r"^nic: 'eth0' is not a network interface of "):
        netstats.pick_interface("eth0")  # for callers that skipped the config check


def test_a_config_that_is_not_utf8_text_or_not_a_file(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("# r\u00e9glages\nmodel: smallcnn\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"is not UTF-8 text \(byte 0xe9 at offset 3\)"):
        config.from_args(["--config", str(path)])
    with pytest.raises(ConfigError, match=r"^config: cannot read .* \(Is a directory\)$"):
        config.from_args(["--config", str(tmp_path)])


def test_default_lr_is_the_models_own_and_is_saved_resolved(tmp_path):
    """lr 0 (the default) takes the model's measured rate, resolved before config.yaml is
    written, so the saved config says the rate the run used and a resume keeps it."""
    assert config.from_args(["--model", "smallcnn"]).lr == config.MODEL_LR["smallcnn"] == 0.1
    assert config.from_args(["--model", "vgg11", "--lr", "0"]).lr == 0.02
    assert config.from_args(["--model", "smallcnn", "--lr", "0.3"]).lr == 0.3
    cfg = config.from_args(["--model", "smallcnn"])
    cfg.save(str(tmp_path / "config.yaml"))
    assert config.from_args([], base=config.load_yaml(str(tmp_path / "config.yaml"))).lr == 0.1
    with pytest.raises(config.ConfigError, match="^lr: must be > 0"):
        config.from_args(["--lr", "-0.1"])
