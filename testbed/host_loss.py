"""The host-loss drill: a 2-host job on the namespace cluster (testbed.netcluster) whose second
host drops off the network mid-epoch (``ip link set eth0 down`` inside its namespace) while its
processes live on. tests/test_host_loss.py runs it once per method; benchmarks/host_loss.py
runs it over rounds and writes the results file.

The job: ``configs/tiny.yaml`` with epochs too many to finish, rank 0 on host 0 (where the
launcher runs), rank 1 on host 1; ``horovod`` under hvd_cifar's horovodrun (MPI mode), ``ddp``
under mpirun. Once its first epoch is in metrics.jsonl, host 1's link goes down. It passes when

* one line from hvd_cifar names host 1 and rank 1, within ``bound_s`` of the link going down
  (and no Python traceback);
* the launcher exits non-zero within ``bound_s``, and every process of the job is gone from both
  hosts (the ranks, mpirun or horovodrun, Open MPI's daemon on host 1, the ssh clients; sshd's
  own session process on host 1 is sshd's, and stays until TCP gives up or the link is back);
* the run folder holds a checkpoint and a ``host_lost`` event, and once the link is back
  ``--resume`` under the same launcher trains one more epoch and exits 0.
"""
from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

from testbed import drill
from testbed.netcluster import NIC, NetCluster
from testbed.netcluster.system import netns_pids, run

METHODS = ("horovod", "ddp")
LAUNCHER = {"horovod": "horovodrun", "ddp": "mpirun"}
BOUND_S = 60.0       # the guarantee: the line, the launcher's end, every process gone
CLEAR_WAIT_S = 10.0  # after the launcher's end, for the processes on the hosts to go
TRAIN = ["--config", drill.TINY, "--epochs", "1000", "--max-steps-per-epoch", "20", "--threads-per-rank", "1",
         "--progress", "false", "--no-tensorboard", "--nic", NIC]


def job_argv(cluster: NetCluster, method: str, flags: list[str]) -> list[str]:
    """The launcher command of a 2-rank job of ``method``, to run on host 0."""
    if LAUNCHER[method] == "horovodrun":
        argv = cluster.horovodrun_argv(2, flags)
        return [cluster.tool("hvd-cifar-horovodrun"), *argv[1:]]  # horovodrun, ending in one line
    return cluster.mpirun_argv(2, flags)


def job_processes(cluster: NetCluster, host: int) -> list[str]:
    """'PID NAME' of every process on ``host`` but sshd's (its listener, and the session
    processes it runs for each connection)."""
    found = []
    for pid in netns_pids(cluster.namespaces[host]):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if name != "sshd" and state != "Z":  # a zombie runs nothing: it only waits to be reaped
            found.append(f"{pid} {name}")
    return found


class Lines:
    """A job's output, line by line as it comes, each with the time it came."""

    def __init__(self, proc: subprocess.Popen):
        self.seen: list[tuple[float, str]] = []
        self.thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self.thread.start()

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            self.seen.append((time.monotonic(), line.rstrip("\n")))

    def text(self) -> str:
        return "\n".join(line for _, line in self.seen)

    def first(self, prefix: str) -> tuple[float, str] | None:
        return next(((t, line) for t, line in self.seen if drill.RANK_TAG.sub("", line).startswith(prefix)), None)


def wait_for_epoch(metrics: Path, proc: subprocess.Popen, lines: Lines, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not (metrics.exists() and metrics.read_text().count("\n") >= 1):
        if proc.poll() is not None:
            raise RuntimeError(f"the job ended (exit {proc.returncode}) before its first epoch:\n{lines.text()[-3000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no epoch within {timeout:.0f} s:\n{lines.text()[-3000:]}")
        time.sleep(0.2)


def wait_clear(cluster: NetCluster, until: float) -> tuple[float | None, list[str]]:
    """Poll both hosts until no job process is left or ``until``: (the time they were clear or
    None, what is left)."""
    while True:
        left = [f"host {h}: {p}" for h in range(cluster.n_hosts) for p in job_processes(cluster, h)]
        if not left:
            return time.monotonic(), []
        if time.monotonic() > until:
            return None, left
        time.sleep(0.2)


def cut_host(cluster: NetCluster, method: str, work: Path, timeout_s: float, bound_s: float = BOUND_S) -> dict:
    """One job of ``method`` on ``cluster`` (2 hosts, host 1's link up), host 1's link taken down
    after its first epoch, judged; host 1's link is up again at the end."""
    run_dir = work / "logs" / "cut"
    flags = [*TRAIN, "--sync", method, "--liveness-timeout-s", f"{timeout_s:g}", "--log-dir", str(work / "logs"),
             "--run-name", "cut"]
    proc = cluster.popen(0, job_argv(cluster, method, flags), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = Lines(proc)
    try:
        wait_for_epoch(run_dir / "metrics.jsonl", proc, lines)
        time.sleep(0.5)  # into the next epoch's steps
        run(["ip", "-n", cluster.namespaces[1], "link", "set", NIC, "down"])
        down = time.monotonic()
        try:
            proc.wait(timeout=bound_s + 30)
        except subprocess.TimeoutExpired:
            pass
        ended = time.monotonic() if proc.poll() is not None else None
        code = proc.returncode  # None: still running (stopped below)
        clear, left = wait_clear(cluster, max(time.monotonic(), down + bound_s) + CLEAR_WAIT_S)
    finally:
        if proc.poll() is None:
            cluster.kill_jobs(extra=[proc.pid])
            proc.wait()
        run(["ip", "-n", cluster.namespaces[1], "link", "set", NIC, "up"])
    lines.thread.join(timeout=5)
    result = judge(lines, code, down, ended, clear, left, bound_s, cluster.hostnames[1])
    result.update(method=method, launcher=LAUNCHER[method], events=read_events(run_dir))
    missing = [what for what, there in (("no checkpoint", (run_dir / "checkpoint_last.pt").exists()),
                                        ("no host_lost event", any(e["event"] == "host_lost" for e in result["events"])))
               if not there]
    if missing:
        result.update(ok=False, why="; ".join(filter(None, [result["why"], *missing])))
    return result


def judge(lines: Lines, code: int | None, down: float, ended: float | None, clear: float | None,
          left: list[str], bound_s: float, lost_host: str) -> dict:
    """The drill's figures (seconds from the link going down) and its verdict (``ok``, ``why``)."""
    ours = drill.our_lines(lines.text())
    said = lines.first("hvd_cifar: error: host")
    since = lambda t: None if t is None else round(t - down, 2)  # noqa: E731
    result = {"exit": code, "line": " | ".join(ours), "line_s": since(said[0]) if said else None,
              "exit_s": since(ended), "clear_s": since(clear), "left": left, "output": lines.text()[-4000:]}
    problems = []
    if len(ours) != 1:
        problems.append(f"{len(ours)} lines from hvd_cifar")
    if not said or f"host {lost_host} (rank 1) stopped answering" not in said[1]:
        problems.append("no line naming the host and rank")
    elif result["line_s"] > bound_s:
        problems.append(f"the line came {result['line_s']:.1f} s after the link went down")
    if "Traceback" in result["output"]:
        problems.append("a Python traceback")
    if code in (None, 0):
        problems.append("the launcher did not end" if code is None else "the launcher exited 0")
    elif result["exit_s"] > bound_s:
        problems.append(f"the launcher ended {result['exit_s']:.1f} s after the link went down")
    if left:
        problems.append(f"left running: {', '.join(left)}")
    elif result["clear_s"] > bound_s + CLEAR_WAIT_S:
        problems.append(f"the last process went {result['clear_s']:.1f} s after the link went down")
    result.update(ok=not problems, why="; ".join(problems))
    return result


def read_events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def resume(cluster: NetCluster, method: str, work: Path, timeout: float = 300) -> dict:
    """``--resume`` of the cut run under the same launcher for one more epoch than it
    checkpointed: (exit status, epochs in metrics.jsonl before and after, output)."""
    run_dir = work / "logs" / "cut"
    records = lambda: [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    before = len(records())
    saved = [e for e in read_events(run_dir) if e["event"] == "host_lost"]
    epochs = (saved[-1]["checkpoint_epoch"] or 0) + 1 if saved else before + 1
    done = cluster.exec(0, job_argv(cluster, method, ["--resume", str(run_dir), "--stop-after", str(epochs),
                                                      "--liveness-timeout-s", "30"]), timeout=timeout)
    return {"resume_exit": done.returncode, "epochs_before": before, "epochs_after": len(records()),
            "resume_output": (done.stdout or "")[-3000:]}
