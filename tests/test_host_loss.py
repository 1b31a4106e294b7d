"""A host that drops off the network mid-epoch, its processes still running, is named in one line
and the job ends: every rank (the cut-off host's too), the launcher non-zero, nothing of the job
left on either host; the run folder keeps its checkpoint and --resume goes on. And the heartbeat
never takes a slow step, checkpoint or evaluation for a lost host.

    .venv/bin/python -m pytest -q tests/test_host_loss.py      # the cluster tests as root; about 70 s in all

On the namespace cluster (testbed.netcluster, 2 hosts, one rank each), host 1's eth0 is taken
down inside its namespace once the first epoch is written (testbed.host_loss has the drill and
its pass criteria; benchmarks/host_loss.py times it at the default timeout). horovod runs under
hvd_cifar's horovodrun (MPI mode), ddp under mpirun, each with a heartbeat timeout of 10 s.
"""
from __future__ import annotations

import json

import pytest

from conftest import NEEDS_NETNS, read_metrics, run_train
from hvd_cifar.trainer import liveness
from testbed import host_loss
from testbed.netcluster import NetCluster

pytestmark = [pytest.mark.slow]

TIMEOUT_S = 10.0  # liveness_timeout_s on the cluster: short, and still far above any pause of a busy machine


@pytest.fixture(scope="module")
def cluster():
    with NetCluster(n_hosts=2, rate=None) as up:
        yield up


@pytest.mark.parametrize("method", host_loss.METHODS)
@NEEDS_NETNS[0]
@NEEDS_NETNS[1]
def test_a_host_whose_link_goes_down_is_named_and_the_job_ends(tmp_path, cluster, method):
    result = host_loss.cut_host(cluster, method, tmp_path, TIMEOUT_S)
    assert result["ok"], f"{result['why']}\n{result['output']}"
    # Silence of TIMEOUT_S after the last heartbeat heard: the line, then the end, come soon after.
    assert TIMEOUT_S - 1.5 <= result["line_s"] <= TIMEOUT_S + 5, result
    assert result["line"].endswith(f"the run folder keeps the checkpoint of epoch "
                                   f"{result['events'][-1]['checkpoint_epoch']}: continue with --resume "
                                   f"{tmp_path / 'logs' / 'cut'}"), result["line"]
    assert result["exit_s"] <= TIMEOUT_S + 10 and result["clear_s"] <= TIMEOUT_S + 10, result
    lost = [e for e in result["events"] if e["event"] == "host_lost"]
    assert [(e["hosts"], e["ranks"], e["silent_s"]) for e in lost] == [([cluster.hostnames[1]], [1], TIMEOUT_S)]
    assert lost[0]["checkpoint_epoch"] >= 1
    # The link is back: the same launcher continues from the checkpoint for one more epoch.
    resumed = host_loss.resume(cluster, method, tmp_path)
    assert resumed["resume_exit"] == 0, resumed["resume_output"]
    assert resumed["epochs_after"] == lost[0]["checkpoint_epoch"] + 1, resumed


PAUSE_S = 4.0  # each slow part, twice the heartbeat's timeout below
SLOW = f"""
import os, time
rank = os.environ.get("OMPI_COMM_WORLD_RANK")
if rank is not None:
    from hvd_cifar.trainer import loop, recording
    def slowly(fn, seconds, busy):
        def slow(*args, **kwargs):
            began = time.monotonic()
            while busy and time.monotonic() - began < seconds / 2:  # Python code holding the GIL by turns
                sum(range(1000))
            time.sleep(seconds - (time.monotonic() - began))
            return fn(*args, **kwargs)
        return slow
    if rank == "1":  # one slow step: rank 0 waits for it in its collective
        after_step = loop.TrainingState.after_step
        def paced(self, step, images):
            after_step(self, step, images)
            if self.epoch == 0 and step == 2:
                slowly(lambda: None, {PAUSE_S}, busy=True)()
        loop.TrainingState.after_step = paced
    else:  # a slow checkpoint write and a slow evaluation: rank 1 waits for rank 0
        recording.save_training = slowly(recording.save_training, {PAUSE_S}, busy=False)
        evaluate = loop.evaluate
        loop.evaluate = lambda run: slowly(evaluate, {PAUSE_S} if run.is_main else 0, busy=True)(run)
"""


def test_slow_steps_checkpoints_and_evaluations_are_no_lost_host(tmp_path, tiny_args):
    """2 ranks under mpirun, one epoch, a heartbeat timeout of 2 s: rank 1's step, rank 0's
    checkpoint write and its evaluation each take 4 s (the other rank waiting in a collective
    meanwhile), and the run goes to its end."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SLOW)
    proc = run_train([*tiny_args, "--epochs", "1", "--liveness-timeout-s", "2", "--no-tensorboard", "--threads-per-rank", "1"],
                     launcher="mpirun", np=2, check=False, timeout=180, env={"PYTHONPATH": str(hook)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "logs" / "run"
    assert [r["epoch"] for r in read_metrics(run)] == [0]
    events = run / "events.jsonl"
    assert not events.exists() or not [json.loads(line) for line in events.read_text().splitlines()]
    # the hook ran: each slow part is in the epoch's times
    first = read_metrics(run)[0]
    assert min(first["epoch_time_s"], first["checkpoint_time_s"], first["eval_time_s"]) >= PAUSE_S, first


def test_a_rank_that_cannot_reach_rank_0_for_the_heartbeat_is_one_line(tmp_path, tiny_args):
    """Rank 0 advertises a host name that does not resolve (MASTER_ADDR): rank 1's connection
    fails, the ranks agree on it, and rank 0 alone says so, with the way out, status 2."""
    proc = run_train([*tiny_args, "--no-tensorboard"], launcher="mpirun", np=2, check=False, timeout=120,
                     env={"MASTER_ADDR": "nowhere.invalid"})
    assert proc.returncode == 2, proc.stderr[-3000:]
    ours = [line for line in proc.stderr.splitlines() if line.startswith("hvd_cifar")]
    assert len(ours) == 1 and ours[0].startswith(
        "hvd_cifar: error: liveness_timeout_s: the ranks' heartbeat could not start: rank 1 on ") and \
        " cannot reach rank 0 at nowhere.invalid:" in ours[0] and ours[0].endswith("; give --liveness-timeout-s 0"), ours


def test_the_line_names_each_silent_host_with_its_ranks():
    peer = lambda rank, host: liveness.Peer(None, rank, host)  # noqa: E731
    assert liveness.named([peer(1, "h1")]) == "host h1 (rank 1)"
    assert liveness.named([peer(1, "h1"), peer(2, "h1"), peer(3, "h2")]) == "hosts h1 (ranks 1, 2) and h2 (rank 3)"
    assert liveness.named([peer(1, "a"), peer(2, "b"), peer(3, "c")]) == "hosts a (rank 1), b (rank 2) and c (rank 3)"


def test_a_host_name_the_others_cannot_resolve_leaves_rank_0s_addresses(tmp_path, tiny_args):
    """Rank 0's host name as the launcher gave it does not resolve (as on a cluster whose nodes do
    not know each other's names): the ranks reach rank 0 at its interfaces' addresses instead."""
    proc = run_train([*tiny_args, "--epochs", "1", "--no-tensorboard"], launcher="mpirun", np=2, check=False,
                     timeout=120, env={"HOROVOD_HOSTNAME": "nowhere.invalid"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not [line for line in proc.stderr.splitlines() if line.startswith("hvd_cifar")], proc.stderr[-3000:]
