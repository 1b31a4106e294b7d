"""What a Slurm cluster harness that died (SIGKILL, a power cut of the test run) left behind,
found by its temp dir ``/tmp/hvds-PID-*`` whose harness PID is gone: the daemons it recorded
(``pids.json``: checked to still be the same programs, by their command line naming the temp
dir) and every process in its nodes' UTS namespaces, stopped; the temp dir removed; then the
namespace clusters of harnesses that died (``testbed.netcluster``'s own ``down``), where a
cluster started with ``netcluster=True`` had its nodes."""
from __future__ import annotations

import json
import os
import re
import shutil

from testbed.netcluster.cleanup import cleanup_leftovers as remove_netclusters
from testbed.netcluster.cleanup import kill
from testbed.slurmcluster.daemons import cmdline, node_pids
from testbed.slurmcluster.layout import PREFIX

STATE = "pids.json"
_NAME = re.compile(rf"^{PREFIX}-(?P<pid>\d+)-")


def record(tmpdir: str, daemon_pids: list[int], namespaces: set[str]) -> None:
    with open(os.path.join(tmpdir, STATE), "w") as f:
        json.dump({"daemons": daemon_pids, "namespaces": sorted(namespaces)}, f)


def _alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def cleanup_leftovers(everything: bool = False, tmp: str = "/tmp") -> list[str]:
    """Stop and remove what dead harnesses left (every harness's, with ``everything``)."""
    removed = []
    for entry in sorted(os.listdir(tmp)):
        match, path = _NAME.match(entry), os.path.join(tmp, entry)
        if not match or not os.path.isdir(path) or (_alive(int(match["pid"])) and not everything):
            continue
        try:
            with open(os.path.join(path, STATE)) as f:
                state = json.load(f)
        except (OSError, ValueError):
            state = {"daemons": [], "namespaces": []}
        daemons = [p for p in state["daemons"] if path in cmdline(p)]
        stray = node_pids(set(state["namespaces"]))
        kill(sorted(set(daemons + stray)))
        shutil.rmtree(path, ignore_errors=True)
        removed.append(f"temp dir {path} ({len(daemons)} daemon(s), {len(stray)} node process(es) stopped)")
    return removed + remove_netclusters()  # dead harnesses' only: --all is about Slurm clusters, not every namespace cluster
