"""Elastic training: workers killed, added and retired while a run goes on.

    .venv/bin/python -m pytest -q tests/test_elastic.py       # as root; under a minute

One real job under horovodrun's elastic driver (Gloo) on the namespace cluster
(``testbed.netcluster``: one slot per host, each host its own address and hostname):
``--min-np 2 --max-np 3``, hosts from ``launch/discover-hosts.sh`` reading a hostfile that the
test edits while the job runs. The job starts on hosts 0, 1, 2; then

  1. the training process on host 2 is SIGKILLed: the others restore the last commit and go on
     as 2 ranks (Horovod blacklists host 2);
  2. host 3 is added to the hostfile: a worker starts there, gets rank 0's state, and the
     3 ranks finish an epoch together;
  3. host 1 is taken out of the hostfile: its worker retires at the next commit, 2 ranks.

The run must then finish on its own (exit 0) with every epoch in metrics.jsonl once, the ranks
ending on identical weights, and events.jsonl telling the story with no more steps redone after
the kill than the commit interval.

The model is the small CNN, whose steps take milliseconds; a hook in every worker (PACE, loaded
as sitecustomize) sleeps after each step for the seconds written in a file, so the test has
time to act between commits while the workers change, and lets the run finish at full speed
once they have.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import NEEDS_NETNS, ROOT
from testbed import netcluster
from testbed.netcluster import NetCluster

pytestmark = [*NEEDS_NETNS, pytest.mark.slow]

COMMIT_EVERY = 3
EPOCHS = 8
STEP_PAUSE_S = "0.3"  # while the workers change
TRAIN = ["--model", "smallcnn", "--dataset", "digits", "--epochs", str(EPOCHS), "--batch-size", "16",
         "--max-steps-per-epoch", "8", "--lr", "0.01", "--warmup-epochs", "0", "--checkpoint-every", "0",
         "--threads-per-rank", "1", "--progress", "false", "--nic", "eth0",
         "--elastic", "true", "--commit-every", str(COMMIT_EVERY)]
DISCOVER = str(ROOT / "launch" / "discover-hosts.sh")
PACE = """
import os, time
if "HOROVOD_HOSTNAME" in os.environ:  # a worker (not horovodrun's driver)
    from hvd_cifar.trainer import elastic
    _after_step = elastic.ElasticState.after_step
    def after_step(self, step, images):
        _after_step(self, step, images)
        try:
            pause = float(open(os.environ["PACE_FILE"]).read())
        except (OSError, ValueError):
            return
        if pause:
            with open(os.environ["PACE_FILE"] + ".paced", "a") as seen:  # which workers the hook reached
                seen.write(f"{os.getpid()}\\n")
            with open(os.environ["PACE_FILE"] + ".at", "a") as at:  # where the workers are: epoch, step
                at.write(f"{self.epoch} {step}\\n")
            time.sleep(pause)
    elastic.ElasticState.after_step = after_step
"""


def write_hosts(path: Path, hosts: list[str]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f"{h} slots=1\n" for h in hosts))
    os.replace(tmp, path)  # the driver reads the file every second: never half of it


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_for(what: str, predicate, job: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if job.poll() is not None:
            raise AssertionError(f"the job ended (exit {job.returncode}) while waiting for {what}")
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def past(at: Path, epoch: int, step: int) -> bool:
    """Whether a worker has reported (the pace hook) a step of ``epoch`` at or after ``step``."""
    if not at.exists():
        return False
    done = [tuple(map(int, line.split())) for line in at.read_text().splitlines() if len(line.split()) == 2]
    return any(e > epoch or (e == epoch and s >= step) for e, s in done)


def trainer_pids(cluster: NetCluster, host: int) -> list[int]:
    """The python training processes on one host (not ssh, not shells)."""
    pids = []
    for pid in netcluster._netns_pids(cluster.namespaces[host]):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[1:3] == [b"-m", b"hvd_cifar.train"]:
            pids.append(pid)
    return pids


def test_kill_add_and_retire_workers_mid_run(tmp_path):
    hostfile = tmp_path / "hosts"
    run_dir = tmp_path / "logs" / "elastic"
    events, metrics = run_dir / "events.jsonl", run_dir / "metrics.jsonl"
    resets = lambda: [e for e in read_jsonl(events) if e["event"] == "reset"]  # noqa: E731
    hook, pace = tmp_path / "hook", tmp_path / "pace"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(PACE)
    pace.write_text(STEP_PAUSE_S)
    with NetCluster(n_hosts=4, rate=None) as cluster:
        h = cluster.hosts
        write_hosts(hostfile, h[:3])
        argv = cluster.elastic_argv(3, 2, 3, DISCOVER, [*TRAIN, "--log-dir", str(tmp_path / "logs"),
                                                         "--run-name", "elastic"])
        output = open(tmp_path / "job.log", "w")
        argv.insert(1, "--verbose")
        job = cluster.popen(0, argv, env={"HVD_CIFAR_HOSTFILE": str(hostfile), "PYTHONUNBUFFERED": "1",
                                          "PYTHONPATH": str(hook), "PACE_FILE": str(pace),
                                          # how long a survivor may wait on a dead peer
                                          "HOROVOD_GLOO_TIMEOUT_SECONDS": "20"},
                            stdout=output, stderr=subprocess.STDOUT)
        try:
            # Into the second epoch, past its first commit (however slowly the machine runs): the
            # kill then rolls back into epoch 1, and epoch 0 stays the 3 ranks' own.
            wait_for("epoch 1 past its first commit", lambda: past(Path(f"{pace}.at"), 1, COMMIT_EVERY + 1), job, 240)
            victims = trainer_pids(cluster, 2)
            assert len(victims) == 1, f"host 2 runs {victims}"
            os.kill(victims[0], signal.SIGKILL)
            wait_for("a reset to 2 ranks", lambda: any(e["world_size"] == 2 for e in resets()), job, 120)

            write_hosts(hostfile, [h[0], h[1], h[3]])  # host 2 stays out; host 3 joins
            wait_for("host 3 to join", lambda: resets()[-1]["world_size"] == 3, job, 180)
            done = len(read_jsonl(metrics))  # let the 3 ranks finish an epoch together
            wait_for("an epoch on 3 ranks", lambda: len(read_jsonl(metrics)) > done, job, 120)

            write_hosts(hostfile, [h[0], h[3]])  # host 1 retires
            wait_for("host 1 to retire", lambda: resets()[-1]["world_size"] == 2 and len(resets()) >= 3, job, 180)
            pace.write_text("0")
            code = job.wait(timeout=600)
        finally:
            if job.poll() is None:
                cluster.kill_jobs(extra=[job.pid])
            output.close()
        log = (tmp_path / "job.log").read_text()
        assert code == 0, f"elastic job exited {code}:\n{log[-5000:]}"

    names = cluster.hostnames
    start, *later = read_jsonl(events)
    assert start["event"] == "start" and start["world_size"] == 3
    assert start["hosts"] == sorted(names[:3])
    killed, joined, retired = later[:3]
    assert (killed["world_size"], killed["hosts"]) == (2, sorted([names[0], names[1]]))
    assert killed["steps_lost"] <= COMMIT_EVERY, killed
    assert killed["step"] % COMMIT_EVERY == 0, killed  # restored to a commit
    assert killed["position"] == killed["step"] * 16 * 3, killed  # images the 3 ranks consumed by then
    assert (joined["world_size"], joined["hosts"]) == (3, sorted([names[0], names[1], names[3]]))
    assert (retired["world_size"], retired["hosts"]) == (2, sorted([names[0], names[3]]))
    assert retired["steps_lost"] == 0, retired  # a retirement waits for a commit: nothing redone

    records = read_jsonl(metrics)
    assert [r["epoch"] for r in records] == list(range(EPOCHS))
    # Every worker paced: hosts 0, 1 and 2 from the start, then host 3. (Not an epoch's time: the kill
    # may land before epoch 1's first commit; epoch 0's record is then of its redone last steps.)
    seen = Path(f"{pace}.paced")
    paced = set(seen.read_text().split()) if seen.exists() else set()
    assert len(paced) >= 4, f"the pace hook reached {len(paced)} worker processes"
    sizes = [r["world_size"] for r in records]
    assert sizes[0] == 3 and sizes[-1] == 2 and 3 in sizes[1:], sizes
    eval_json = json.loads((run_dir / "eval.json").read_text())
    assert eval_json["parameters_identical_across_ranks"] is True
    assert records[-1]["train_loss"] < records[0]["train_loss"], [r["train_loss"] for r in records]
