"""Real 2-rank runs under every launcher, and 2 ranks computing what 1 rank computes."""
import json
import os
import subprocess
import time

import pytest
import torch

from conftest import ROOT, read_metrics, run_train
from hvd_cifar.launch import commands


@pytest.mark.parametrize("launcher", ["horovodrun", "horovodrun-gloo", "mpirun"])
def test_two_ranks_train_under_each_launcher(tiny_run, launcher):
    run = tiny_run(launcher).run  # 2 ranks, 2 epochs
    records = read_metrics(run)
    assert [r["epoch"] for r in records] == [0, 1]
    for record in records:
        assert record["world_size"] == 2
        assert record["comm_bytes_per_sync"] > 0
        # every rank saw its shard: images counted across ranks
        assert record["images_per_s"] > 0 and record["steps"] == 6
    meta = json.loads((run / "meta.json").read_text())
    assert meta["world_size"] == 2
    # the communication settings in effect are recorded, hvd_cifar's defaults included
    assert meta["comm_settings"]["HOROVOD_CYCLE_TIME"] == "5"
    # no timeline asked for, none set: its writer thread would spin beside the training threads
    assert "HOROVOD_TIMELINE" not in meta["comm_settings"]
    if launcher == "mpirun":
        assert meta["comm_settings"]["OMPI_MCA_mpi_yield_when_idle"] == "1"
    # on one host Open MPI's allreduce under MPI's controller (shared memory), Gloo's under Gloo's;
    # across hosts Gloo's under both (test_netcluster.py)
    assert meta["comm_settings"].get("HOROVOD_CPU_OPERATIONS") == ("gloo" if launcher == "horovodrun-gloo" else None)
    assert (run / "rank0.log").exists() and (run / "rank1.log").exists()


@pytest.mark.parametrize("script", ["launch/horovodrun.sh", "launch/mpirun.sh"])
def test_launch_scripts_read_the_hostfile(script_run, script):
    # The script's job (conftest.SCRIPT_JOBS) is also the run another file checks: mpirun.sh's
    # test_comm_options.py's frozen blocks, horovodrun.sh's test_horovod_tuning.py's keys.
    job = script_run(script)  # -np 2 -hostfile: "# one machine", a blank line, "localhost slots=2"
    assert job.proc.returncode == 0, job.proc.stderr[-3000:]
    assert read_metrics(job.run)[0]["world_size"] == 2


def test_bad_config_under_mpirun_is_one_line_from_one_rank(tmp_path):
    proc = run_train(["--batch-size", "0"], launcher="mpirun", np=2, check=False)
    assert proc.returncode != 0
    ours = [line for line in proc.stderr.splitlines() if "hvd_cifar" in line]
    assert ours == ["hvd_cifar: error: batch_size: must be >= 1, got 0"]


FAIL_MID_EPOCH = """
import os
if (os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("HOROVOD_RANK")) == "1":
    import hvd_cifar.workload.data as d
    original = d.ShardedLoader.epoch
    def epoch(self, *args, **kwargs):
        for i, batch in enumerate(original(self, *args, **kwargs)):
            if i == 3:
                raise OSError("disk on fire")
            yield batch
    d.ShardedLoader.epoch = epoch
"""


@pytest.mark.slow
@pytest.mark.parametrize("launcher, sync", [
    ("mpirun", "horovod"), ("mpirun", "mpi-allreduce"), ("mpirun", "mpi-gather-scatter"), ("mpirun", "ddp"),
    ("horovodrun-gloo", "horovod"), ("horovodrun-gloo", "ddp")])
def test_an_exception_on_one_rank_aborts_the_job(tmp_path, tiny_args, launcher, sync):
    """Rank 1 alone fails at its 4th batch while rank 0 goes on into the gradient collective:
    one message from rank 1, and rank 0 must not wait forever."""
    (tmp_path / "sitecustomize.py").write_text(FAIL_MID_EPOCH)
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}")
    from conftest import launch_argv
    start = time.monotonic()
    proc = subprocess.run([*launch_argv(launcher, 2), *tiny_args, "--sync", sync], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert time.monotonic() - start < 60
    assert proc.stderr.count("hvd_cifar: rank 1 failed") == 1 and "disk on fire" in proc.stderr
    # rank 0 reports no fault of its own: one line saying it stopped, no traceback. (Plain
    # horovodrun adds a traceback of its own driver, untagged; launch/horovodrun.sh does not.)
    assert "rank 0 failed" not in proc.stderr
    rank_tracebacks = (proc.stderr.count("]<stderr>:Traceback") if launcher.startswith("horovodrun")
                       else proc.stderr.count("Traceback"))
    assert rank_tracebacks == 1
    assert not (tmp_path / "logs" / "run" / "metrics.jsonl").exists()  # it failed in the first epoch


def test_two_ranks_compute_the_update_one_rank_computes_for_their_images(tmp_path):
    """Data parallelism, exactly: 2 ranks of 32 images (mpirun) take the update 1 rank takes for
    the same 64 images (step s covers the same 64 positions of the epoch's permutation; the mean
    of the 2 ranks' gradients is the 64-image gradient; the 2-rank rate is scaled by 2, so the
    1-rank run is given the same rate). No BatchNorm and no augmentation, whose statistics and
    random crops are per rank. Whether the ranks reach 95 % at the defaults: test_convergence and
    benchmarks/convergence.py."""
    common = ["--config", "configs/tiny.yaml", "--batchnorm", "false", "--augment", "false", "--epochs", "1",
              "--max-steps-per-epoch", "3", "--log-dir", str(tmp_path)]
    run_train([*common, "--batch-size", "32", "--lr", "0.05", "--run-name", "np2"], launcher="mpirun", np=2)
    run_train([*common, "--batch-size", "64", "--lr", "0.1", "--run-name", "np1"])
    two, one = (torch.load(tmp_path / name / "checkpoint_last.pt", weights_only=True)["model"] for name in ("np2", "np1"))
    for key in one:
        assert torch.allclose(two[key], one[key], atol=1e-5, rtol=0), key
    [r2], [r1] = read_metrics(tmp_path / "np2"), read_metrics(tmp_path / "np1")
    assert (r2["world_size"], r1["world_size"], r2["lr"]) == (2, 1, r1["lr"])
    assert r2["train_loss"] == pytest.approx(r1["train_loss"], rel=1e-5)


def test_mpirun_flags_export_only_the_variables_mpiruns_environment_sets():
    """mpirun warns of each -x variable its environment lacks (three lines in every job's output
    under Slurm's mpirun style): only those set are exported."""
    flags = commands.recommended_mpirun_flags({"PATH": "/bin", "HOROVOD_TIMELINE": "t.json"})
    assert [flags[i + 1] for i, f in enumerate(flags) if f == "-x"] == ["PATH", "HOROVOD_TIMELINE"]
    assert flags[:4] == list(commands.MAP_FLAGS) and flags[-len(commands.TRANSPORT_FLAGS):] == list(commands.TRANSPORT_FLAGS)


def test_gloos_operations_under_mpirun_train_the_same_weights_as_mpis(tiny_run, tmp_path):
    """HOROVOD_CPU_OPERATIONS=gloo from the launcher on one host under MPI's controller (Fix 11 of
    scripts/install.sh; hvd_cifar's choice across hosts): Gloo's allreduce, recorded as the
    setting in effect, and at 2 ranks the same weights bit for bit as Open MPI's (a sum of two
    gradients is the same whichever library adds them)."""
    mpi = tiny_run("mpirun").run
    logs = tmp_path / "logs"
    run_train(["--config", str(ROOT / "configs" / "tiny.yaml"), "--log-dir", str(logs), "--run-name", "run"],
              launcher="mpirun", np=2, env={"HOROVOD_CPU_OPERATIONS": "gloo"})
    meta = json.loads((logs / "run" / "meta.json").read_text())
    assert meta["comm_settings"]["HOROVOD_CPU_OPERATIONS"] == "gloo"
    gloo, ours = (torch.load(run / "checkpoint_last.pt", weights_only=True)["model"] for run in (logs / "run", mpi))
    assert gloo.keys() == ours.keys() and all(torch.equal(gloo[k], ours[k]) for k in gloo)


def test_gloos_operations_under_mpi_are_refused_by_a_horovod_without_the_fix(monkeypatch):
    """A Horovod not built by scripts/install.sh segfaults on Gloo's operations under MPI's
    controller: asked for, they are refused in one line; not asked for, MPI's are kept."""
    import horovod

    from hvd_cifar.core.errors import ConfigError
    from hvd_cifar.sync import horovod as ours

    monkeypatch.delattr(horovod, "hvd_cifar_gloo_ops_under_mpi", raising=False)
    monkeypatch.delenv("HOROVOD_CONTROLLER", raising=False)
    monkeypatch.delenv("HOROVOD_CPU_OPERATIONS", raising=False)
    ours.use_gloo_operations()
    assert "HOROVOD_CPU_OPERATIONS" not in os.environ
    monkeypatch.setenv("HOROVOD_CPU_OPERATIONS", "gloo")
    with pytest.raises(ConfigError, match="^HOROVOD_CPU_OPERATIONS=gloo: this Horovod runs Gloo's operations only"):
        ours.use_gloo_operations()
    # with the fix: Gloo's across hosts, on the interface MPI's bytes use; Open MPI's on one host
    monkeypatch.setattr(horovod, "hvd_cifar_gloo_ops_under_mpi", True, raising=False)
    monkeypatch.setenv("OMPI_MCA_btl_tcp_if_include", "eth0")
    for local, gloo in (("2", False), ("1", True)):
        monkeypatch.delenv("HOROVOD_CPU_OPERATIONS", raising=False)
        monkeypatch.delenv("HOROVOD_GLOO_IFACE", raising=False)
        monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
        monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", local)
        ours.use_gloo_operations()
        assert (os.environ.get("HOROVOD_CPU_OPERATIONS"), os.environ.get("HOROVOD_GLOO_IFACE")) == \
            (("gloo", "eth0") if gloo else (None, None))
