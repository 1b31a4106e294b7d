"""The command line as a newcomer types it: horovodrun with a hostfile in either form, --help on
every command (the trainer's made from the config), refusals whose hints work when followed,
rates and sizes as plain numbers, and keys that do nothing said so."""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess

import pytest

from conftest import BIN, PYTHON, ROOT, TINY, md_table, read_metrics, run_train
from hvd_cifar.core import combinations, config, config_help, methods, units

HOSTFILE = "# this machine, as a user writes it\n\nlocalhost slots=2   # two ranks\n"


def env() -> dict:
    return dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", PATH=f"{BIN}:{os.environ['PATH']}")


@pytest.mark.parametrize("form", ["-H", "-hostfile"])
def test_horovodrun_runs_the_documented_command_with_a_hostfile(tmp_path, form):
    """``horovodrun -np 2 -H HOSTFILE python -m hvd_cifar.train ...`` (and ``-hostfile``) with a
    hostfile holding a comment, a blank line and slots=: two real ranks train."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text(HOSTFILE)
    proc = subprocess.run([str(BIN / "horovodrun"), "-np", "2", form, str(hostfile), PYTHON, "-m", "hvd_cifar.train",
                           "--config", TINY, "--epochs", "1", "--max-steps-per-epoch", "2", "--no-tensorboard",
                           "--log-dir", str(tmp_path / "logs"), "--run-name", "run"],
                          cwd=ROOT, env=env(), text=True, capture_output=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "logs" / "run" / "meta.json").read_text())["world_size"] == 2
    assert [r["epoch"] for r in read_metrics(tmp_path / "logs" / "run")] == [0]


@pytest.mark.parametrize("command", [["horovodrun", "-H"], ["horovodrun", "-hostfile"], ["hvd-cifar-horovodrun", "-H"]])
def test_a_malformed_hostfile_is_one_line_naming_the_file_and_line(tmp_path, command):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# two hosts\nlocalhost slots=2\nnode2 slots two\n")
    exe, form = command
    proc = subprocess.run([str(BIN / exe), "-np", "2", form, str(hostfile), PYTHON, "-c", "pass"],
                          env=env(), text=True, capture_output=True, timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == [f"horovodrun: error: hostfile {hostfile}:3: cannot parse 'node2 slots two' "
                     f"(expected 'HOST slots=N' or 'HOST:N')"], proc.stderr[-2000:]


COMMANDS = ["hvd_cifar.train", "hvd_cifar.report", "hvd_cifar.predict", "hvd_cifar.probe", "hvd_cifar.bench",
            "hvd_cifar.launch.horovodrun", "hvd_cifar.launch.hostfile", "hvd_cifar.launch.commands",
            "hvd_cifar.launch.slurm_resume", "hvd_cifar.launch.slurm_output", "hvd_cifar.sync.overlap",
            "testbed.netcluster", "testbed.slurmcluster"]


def test_every_command_declared_answers_help():
    """Each command of pyproject.toml, by -h and by --help: a usage page on stdout, status 0."""
    declared = re.findall(r'^hvd-cifar-[\w-]+ = "([\w.]+):\w+"', (ROOT / "pyproject.toml").read_text(), re.M)
    modules = {m.replace(".cli", "") for m in declared}
    assert modules == set(COMMANDS), modules ^ set(COMMANDS)
    for module in COMMANDS:
        for flag in ("-h", "--help"):
            proc = subprocess.run([PYTHON, "-m", module, flag], cwd=ROOT, text=True, capture_output=True, timeout=120)
            assert proc.returncode == 0 and proc.stdout.startswith("usage:"), (module, flag, proc.stderr[-1000:])


def test_train_help_config_and_config_md_list_the_same_keys_in_the_same_groups():
    """The help is generated from Config (every field, its flag, type and default); docs/CONFIG.md's
    tables, one per group, name exactly the same keys in the same groups."""
    proc = subprocess.run([PYTHON, "-m", "hvd_cifar.train", "--help"], cwd=ROOT, text=True, capture_output=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    flags = re.findall(r"^  --([\w-]+) ", proc.stdout, re.M)
    assert sorted(f.replace("-", "_") for f in flags) == sorted(config.FIELDS)
    assert "  --batch-size INT  (default 32)" in proc.stdout and "  --sync horovod|" in proc.stdout
    # a registry's key: in its method's group, with the meaning its Setting declares
    ps_servers = methods.METHODS["mpi-async-ps"].settings["ps_servers"]
    group = proc.stdout.split("\nsync: mpi-async-ps:\n", 1)[1].split("\n\n", 1)[0]
    assert group.startswith("  --ps-servers INT  (default 1)\n") and ps_servers.meaning in " ".join(group.split())
    assert "scikit-learn" in proc.stdout.split("--dataset ", 1)[1].split("\n  --", 1)[0]
    doc = (ROOT / "docs" / "CONFIG.md").read_text()
    for group, keys in config_help.groups().items():
        rows = md_table(doc, f"### {group[0].upper()}{group[1:]}")
        documented = {k for row in rows for k in re.findall(r"`(\w+)(?::[^`]*)?`", row["key"]) if k in config.FIELDS}
        assert documented == {key for key, _ in keys}, (group, documented ^ {key for key, _ in keys})
        assert all(meaning for _, meaning in keys), group


# Every combination the validator refuses with a hint (each alternative in ConfigError.fixes).
REFUSED = [
    ["--elastic", "--freeze", "auto"],
    ["--elastic", "--freeze-schedule", "{1: 1}"],
    ["--freeze", "auto", "--freeze-schedule", "{1: 1}"],
    ["--freeze", "auto", "--sync", "mpi-async-ps"],
    ["--fp16-allreduce", "--compression", "topk"],
    ["--local-sgd-steps", "4", "--compression", "powersgd"],
    ["--compression", "powersgd", "--sync", "mpi-allreduce"],
    ["--compression", "topk", "--elastic"],
    ["--compression", "powersgd", "--comm-timeline"],
    ["--compression", "powersgd", "--amp", "fp16"],
    ["--local-sgd-steps", "4", "--freeze", "auto"],
    ["--compression", "topk", "--no-topk-momentum-correction"],
    ["--compression", "topk", "--grad-clip", "0"],
    ["--compression", "topk", "--freeze", "auto"],
    ["--threads-per-rank", "100000"],
    ["--compute", "fp32", "--amp", "bf16"],
    ["--compute", "bf16", "--channels-last"],
    ["--local-sgd-steps", "4", "--fp16-allreduce"],
    ["--elastic", "--sync", "ddp"],
    ["--comm-timeline", "--sync", "mpi-allreduce"],
    ["--compression", "fp16", "--sync", "mpi-async-ps"],
    ["--amp", "fp16", "--sync", "mpi-async-ps"],
    ["--compute", "fp16", "--sync", "mpi-async-ps"],
]


def _raise_sites_with_fixes() -> set[tuple[str, int]]:
    sites = set()
    for path in (ROOT / "hvd_cifar" / "core").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and \
                    any(k.arg == "fixes" for k in node.exc.keywords):
                sites.add((path.name, node.lineno))
    return sites


def test_every_hint_the_validator_prints_runs_when_followed():
    """Each refused combination's hint, applied as printed, is accepted; every raise that
    carries a hint is reached by one of the cases (a new hint needs a case here). tensorboard's
    (package missing) is the one left out: this venv has the package."""
    reached = set()
    for argv in REFUSED:
        with pytest.raises(config.ConfigError) as caught:
            config.from_args([*argv, "--no-tensorboard"])
        error = caught.value
        assert error.fixes, (argv, str(error))
        frame = error.__traceback__
        while frame.tb_next:
            frame = frame.tb_next
        reached.add((os.path.basename(frame.tb_frame.f_code.co_filename), frame.tb_lineno))
        assert str(error).endswith("; give " + ", or ".join(" ".join(fix) for fix in error.fixes)), str(error)
        for fix in error.fixes:
            config.from_args([*argv, "--no-tensorboard", *fix])  # accepted: raises nothing
    missing = {site for site in _raise_sites_with_fixes() if site not in reached}
    tensorboard = {s for s in missing if "tensorboard" in (ROOT / "hvd_cifar" / "core" / s[0]).read_text().splitlines()[s[1]]}
    assert missing == tensorboard and len(tensorboard) == 1, missing


@pytest.mark.parametrize("text, bits", [("1e9", 10 ** 9), ("1000000000", 10 ** 9), ("1gbit", 10 ** 9),
                                        ("100mbit", 10 ** 8), ("2.5gbit", 25 * 10 ** 8), ("1.5e8", 15 * 10 ** 7)])
def test_rates_take_plain_bits_per_second_and_tc_notation(text, bits):
    assert units.parse_rate(text) == bits


@pytest.mark.parametrize("text, size", [("4096", 4096), ("1e6", 10 ** 6), ("4KiB", 4096), ("25MB", 25 * 10 ** 6),
                                        ("1GiB", 2 ** 30), ("512b", 512)])
def test_sizes_take_plain_bytes_and_units(text, size):
    assert units.parse_size(text) == size


def test_a_wrong_rate_or_size_names_the_accepted_forms():
    with pytest.raises(ValueError, match=r"expected bits per second as a number \('1e9'.*'1gbit'"):
        units.parse_rate("fast")
    with pytest.raises(ValueError, match=r"expected bytes as a number \('4096'.*'4KiB'"):
        units.parse_size("4 lots")
    proc = subprocess.run([PYTHON, "-m", "hvd_cifar.probe", "--max-bytes", "lots"], cwd=ROOT, text=True,
                          capture_output=True, timeout=120)
    assert proc.returncode == 2 and "size: cannot parse 'lots'" in proc.stderr, proc.stderr


def test_inert_keys_are_found_only_when_given_and_inert():
    cfg = config.from_args(["--no-tensorboard"])
    assert combinations.inert_keys(cfg, {"topk_fraction", "powersgd_rank", "horovod_cycle_time_ms", "lr"}) == {
        "topk_fraction": "a top-k setting, and compression is none",
        "powersgd_rank": "a PowerSGD setting, and compression is none"}
    topk = config.from_args(["--compression", "topk", "--no-tensorboard"])
    assert combinations.inert_keys(topk, {"topk_fraction", "compression_warmup_steps"}) == {}
    ddp = config.from_args(["--sync", "ddp", "--horovod-cycle-time-ms", "3", "--no-tensorboard"])
    assert combinations.inert_keys(ddp, config.given_keys(["--sync", "ddp", "--horovod-cycle-time-ms", "3"])) \
        == {"horovod_cycle_time_ms": "Horovod's own setting, and sync is ddp"}
    assert combinations.inert_keys(ddp, {"ps_servers", "compression_warmup_steps"}) == {
        "ps_servers": "asynchronous parameter server's own setting, and sync is ddp",
        "compression_warmup_steps": "the warm-up of powersgd, topk, local-sgd, and compression is none"}


def test_an_inert_key_is_one_warning_from_rank_0_and_in_meta_json(tmp_path, tiny_args):
    """Two ranks, --topk-fraction without top-k: one warning line in all the job's output, the
    key and why in meta.json, the run trains; the same run without the key warns of nothing."""
    flags = [*tiny_args, "--epochs", "1", "--max-steps-per-epoch", "2", "--no-tensorboard"]
    proc = run_train([*flags, "--topk-fraction", "0.01"], launcher="mpirun", np=2)
    warnings = [line for line in (proc.stdout + proc.stderr).splitlines() if "warning" in line]
    assert len(warnings) == 1 and "hvd_cifar: warning: topk_fraction: has no effect here" in warnings[0], warnings
    meta = json.loads((tmp_path / "logs" / "run" / "meta.json").read_text())
    assert meta["inert_keys"] == {"topk_fraction": "a top-k setting, and compression is none"}
    clean = run_train([*flags, "--run-name", "run2"], launcher="mpirun", np=2)
    assert "warning" not in clean.stdout + clean.stderr
    assert json.loads((tmp_path / "logs" / "run2" / "meta.json").read_text())["inert_keys"] == {}
