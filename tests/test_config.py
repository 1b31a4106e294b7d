import dataclasses
import json
import re
import subprocess

import pytest
import yaml

from conftest import PYTHON, ROOT, read_metrics, run_train
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
    (["--augment"], True),
    (["--no-augment"], False),
    (["--augment", "true"], True),
    (["--augment", "false"], False),
    (["--augment=false"], False),
    (["--no-augment", "--augment"], True),  # the last flag of a key wins
])
def test_boolean_flag_forms(argv, expected):
    assert config.from_args(argv).augment is expected


@pytest.mark.parametrize("argv, compression", [
    (["--fp16-allreduce"], "fp16"), (["--no-fp16-allreduce"], "none"), (["--fp16-allreduce", "true"], "fp16"),
    (["--fp16-allreduce", "false"], "none"), (["--fp16-allreduce=true"], "fp16"),
])
def test_the_fp16_alias_takes_every_boolean_form(argv, compression):
    assert config.from_args(argv).compression == compression


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
    (["--sync", "mpi-async-ps", "--local-sgd-steps", "2"], "compression"),  # read as compression: local-sgd
    (["--compression", "topk", "--comm-timeline"], "compression"),
    (["--compression", "topk", "--elastic"], "compression"),
    (["--compression", "powersgd", "--amp", "fp16"], "compression"),
    (["--sync", "ddp", "--local-sgd-steps", "2", "--freeze", "auto"], "compression"),
    (["--compression", "local-sgd", "--local-sgd-steps", "1"], "local_sgd_steps"),
    (["--compression", "fp16", "--sync", "mpi-async-ps"], "compression"),  # its entry's native: none
    (["--amp", "fp16", "--sync", "mpi-async-ps"], "amp"),                   # its entry: no grad scaler
    (["--comm-timeline", "--sync", "mpi-allreduce"], "comm_timeline"),
    (["--elastic", "--sync", "ddp"], "elastic"),
    (["--ps-servers", "0"], "ps_servers"),
    (["--no-nesterov=1"], "nesterov"),
    (["--fp16-allreduce", "maybe"], "fp16_allreduce"),
    (["--batch-size", "8", "stray"], "command line"),
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
def test_fp16_allreduce_is_read_as_compression_fp16_its_one_setting(argv, compression):
    cfg = config.from_args(argv)
    assert cfg.compression == compression and "fp16_allreduce" not in config.FIELDS


def test_schemes_run_under_horovod_and_ddp():
    """Accepted under the two methods that run a scheme, as asked (with accumulation; local SGD
    with amp fp16, which keeps no residual), and refused under one that does not."""
    for sync in ("horovod", "ddp"):
        cfg = config.from_args(["--sync", sync, "--compression", "powersgd", "--accumulation-steps", "2"])
        assert (cfg.sync, cfg.compression, cfg.accumulation_steps) == (sync, "powersgd", 2)
        cfg = config.from_args(["--sync", sync, "--compression", "local-sgd", "--local-sgd-steps", "4", "--amp", "fp16"])
        assert (cfg.sync, cfg.local_sgd_steps, cfg.amp, cfg.compression) == (sync, 4, "fp16", "local-sgd")
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


def test_the_config_is_frozen_and_validation_returns_the_settled_copy():
    """Nothing assigns to a Config; validate leaves the one it was given as it was and returns the
    copy the run uses, which remembers what was given (config.yaml) and what it settled and why
    (resolved.yaml)."""
    given = Config(model="smallcnn", compute="bf16")
    with pytest.raises(dataclasses.FrozenInstanceError):
        given.lr = 0.3
    used = given.validate()
    assert (given.lr, given.amp) == (0.0, "none")
    assert (used.lr, used.amp, used.channels_last, used.compute) == (0.1, "bf16", False, "bf16")
    assert (used.given()["lr"], used.given()["amp"]) == (0.0, "none")
    assert used.resolved() == {"values": {"lr": 0.1, "amp": "bf16"},
                               "how": {"lr": "0 asks for smallcnn's default rate", "amp": "from compute: bf16"}}
    assert used.validate() == used and used.validate().resolved() == used.resolved()  # settling again changes nothing
    with pytest.raises(ConfigError, match=r"^epochs: expected int, got '3' \(str\)$"):  # a Config made in code
        Config(epochs="3").validate()


ALIAS_LINES = {
    "fp16": "fp16_allreduce: true read as compression: fp16 (its one spelling)",
    "no-fp16": "fp16_allreduce: false dropped (compression alone says what goes on the wire)",
    "steps2": "local_sgd_steps: 2 read as compression: local-sgd with local_sgd_steps: 2 (its one spelling)",
    "steps1": "local_sgd_steps: 1 dropped (it meant no local SGD; local SGD is compression: local-sgd)",
}


@pytest.mark.parametrize("argv, compression, steps, said", [
    (["--fp16-allreduce"], "fp16", 4, ["fp16"]),
    (["--no-fp16-allreduce"], "none", 4, ["no-fp16"]),
    (["--local-sgd-steps", "2"], "local-sgd", 2, ["steps2"]),
    (["--local-sgd-steps", "2", "--compression", "none"], "local-sgd", 2, ["steps2"]),
    (["--local-sgd-steps", "1", "--compression", "topk"], "topk", 4, ["steps1"]),
    (["--local-sgd-steps", "1"], "none", 4, ["steps1"]),
    (["--compression", "local-sgd", "--local-sgd-steps", "3"], "local-sgd", 3, []),  # the one spelling: nothing said
])
def test_each_alias_is_read_as_its_one_spelling_and_said_once(argv, compression, steps, said):
    cfg = config.from_args(argv)
    assert (cfg.compression, cfg.local_sgd_steps) == (compression, steps)
    assert config.aliases_read(argv) == [ALIAS_LINES[s] for s in said]
    assert "fp16_allreduce" not in config.given_keys(argv)


def test_an_alias_in_the_yaml_file_is_read_and_said_there_too(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("fp16_allreduce: true\n")
    assert config.from_args(["--config", str(path)]).compression == "fp16"
    assert config.aliases_read(["--config", str(path), "--local-sgd-steps", "1"]) == [ALIAS_LINES["fp16"],
                                                                                      ALIAS_LINES["steps1"]]


def test_a_run_saved_with_the_old_spellings_resumes_as_it_ran_and_is_not_said(tmp_path, capsys):
    """A run folder saved when fp16_allreduce and local_sgd_steps were switches: its config.yaml,
    the resumed run's base, reads as the one spelling, and nothing is said of it (the user did not
    write it); an alias on the resumed run's own command line is said once."""
    from hvd_cifar import train
    from hvd_cifar.runfolder import reader
    for name, old, compression in (("fp16", {"fp16_allreduce": True, "compression": "fp16", "local_sgd_steps": 1},
                                    "fp16"),
                                   ("local", {"fp16_allreduce": False, "compression": "none", "local_sgd_steps": 4},
                                    "local-sgd")):
        run = tmp_path / name
        run.mkdir()
        (run / "config.yaml").write_text(yaml.safe_dump({"model": "smallcnn", "lr": 0.1, **old}))
        assert reader.read_config(str(run))["compression"] == compression
        cfg = train.load_config(["--resume", str(run), "--no-tensorboard"])
        assert (cfg.compression, cfg.resume, cfg.lr) == (compression, str(run), 0.1)
        assert capsys.readouterr().err == ""
    train.load_config(["--resume", str(run), "--no-tensorboard", "--no-fp16-allreduce"])
    assert capsys.readouterr().err == f"hvd_cifar: warning: {ALIAS_LINES['no-fp16']}\n"


def test_a_saved_config_never_reads_back_as_an_alias(tmp_path):
    """config.yaml holds a scheme's own keys only under that scheme: local_sgd_steps beside
    compression: none would read back as local SGD's old switch."""
    for flags in ([], ["--compression", "topk"], ["--compression", "local-sgd", "--local-sgd-steps", "3"]):
        cfg = config.from_args(flags)
        cfg.save(str(tmp_path / "config.yaml"))
        saved = config.load_yaml(str(tmp_path / "config.yaml"))
        assert ("local_sgd_steps" in saved) == (cfg.compression == "local-sgd")
        assert ("topk_fraction" in saved) == (cfg.compression == "topk")
        assert config.from_args(["--config", str(tmp_path / "config.yaml")]) == cfg


def test_what_a_run_settles_is_in_resolved_yaml_and_a_resume_reads_it_back(tmp_path, tiny_args):
    """Two ranks, lr 0 and compute: auto, with the fp16 alias: config.yaml holds the config as
    given (the alias read), resolved.yaml what the run used (the model's lr, compute's choice,
    the run folder) and why; the alias is said once in all the job's output. The resumed run
    starts from those values and says no alias."""
    from hvd_cifar.runfolder import reader
    env = {"HVD_CIFAR_CACHE_DIR": str(tmp_path / "cache")}
    first = run_train([*tiny_args, "--lr", "0", "--compute", "auto", "--fp16-allreduce", "--stop-after", "1",
                       "--max-steps-per-epoch", "2", "--no-tensorboard"], launcher="mpirun", np=2, env=env)
    said = [line for line in (first.stdout + first.stderr).splitlines() if "warning" in line]
    assert said == [f"hvd_cifar: warning: {ALIAS_LINES['fp16']}"], said
    run = tmp_path / "logs" / "run"
    given = yaml.safe_load((run / "config.yaml").read_text())
    assert (given["lr"], given["compute"], given["compression"], given["run_name"]) == (0.0, "auto", "fp16", "run")
    assert "fp16_allreduce" not in given
    resolved = yaml.safe_load((run / "resolved.yaml").read_text())
    chosen = json.loads((run / "meta.json").read_text())["compute_choice"]["setting"]
    assert resolved["values"]["lr"] == config.MODEL_LR["smallcnn"] and resolved["values"]["compute"] == chosen
    assert "log_dir" not in resolved["values"]  # given as the folder the run folder is in: nothing to settle
    assert resolved["how"]["compute"].startswith("auto: fastest of") and set(resolved["how"]) == set(resolved["values"])
    again = run_train(["--resume", str(run), "--stop-after", "0"], launcher="mpirun", np=2, env=env)
    assert "warning" not in again.stdout + again.stderr
    assert f"compute={chosen} (named in the config)" in again.stdout
    seen = reader.read_config(str(run))
    assert (seen["lr"], seen["compute"], seen["compression"], seen["resume"]) == (0.1, chosen, "fp16", str(run))
    assert [r["epoch"] for r in read_metrics(run)] == [0, 1]


@pytest.mark.parametrize("text, says", [("values: [1\n", "cannot be read"), ("- 1\n", "must hold 'values' and 'how'"),
                                        ("values: {lr: 0.1}\n", "must hold 'values' and 'how'")])
def test_a_resolved_yaml_that_cannot_be_read_is_one_line_naming_it(tmp_path, text, says):
    """To the readers a ReportError, to a resume bad input (exit status 2), each one line naming the file."""
    from hvd_cifar import train
    from hvd_cifar.core.errors import ReportError
    from hvd_cifar.core.files import RunError
    from hvd_cifar.runfolder import reader
    (tmp_path / "config.yaml").write_text("model: smallcnn\n")
    (tmp_path / "resolved.yaml").write_text(text)
    with pytest.raises(ReportError, match=rf"^{tmp_path}/resolved.yaml: {re.escape(says)}") as read:
        reader.read_config(str(tmp_path))
    with pytest.raises(RunError, match=rf"^resume: {tmp_path}/resolved.yaml: {re.escape(says)}") as resumed:
        train.load_config(["--resume", str(tmp_path), "--no-tensorboard"])
    assert "\n" not in str(read.value) + str(resumed.value)
