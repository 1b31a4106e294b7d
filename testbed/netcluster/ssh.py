"""ssh between the hosts. One sshd per host (/usr/sbin/sshd -D with its own config in the temp
dir: host key, AuthorizedKeysFile, PidFile, UsePAM no, StrictModes no, root by key only), started
like any job (jobs.py), so ssh sessions land in the host's namespaces. Clients use
``TMP/bin/ssh``, first on the cluster's PATH: ``/usr/bin/ssh -F TMP/ssh_config``, which names the
harness's key and neither checks nor records host keys, so horovodrun's and mpirun's own ssh
command lines work without touching ~/.ssh. (ssh reads the home directory from the password
database, not $HOME, hence a wrapper rather than a temporary HOME.)"""
from __future__ import annotations

import os
import shutil
import subprocess
import time

from testbed.netcluster import jobs
from testbed.netcluster.layout import Layout
from testbed.netcluster.system import ClusterError, run

SSHD = "/usr/sbin/sshd"           # sshd refuses to start unless run by absolute path
SSH = "/usr/bin/ssh"
SSH_PORT = 22


def write_files(cluster: Layout) -> None:
    """Keys, the hosts file, the client's config and wrapper, one sshd config per host."""
    t = cluster.tmpdir
    for key, comment in ((cluster.host_key, "hvdc host"), (cluster.key, "hvdc client")):
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", key])
    shutil.copyfile(cluster.key + ".pub", os.path.join(t, "authorized_keys"))
    with open(cluster.hosts_file, "w") as f:
        f.write("127.0.0.1 localhost\n::1 localhost\n")
        f.writelines(f"{addr} {name}\n" for addr, name in zip(cluster.hosts, cluster.hostnames))
    with open(os.path.join(t, "ssh_config"), "w") as f:
        f.write(f"Host *\n  IdentityFile {cluster.key}\n  IdentitiesOnly yes\n"
                f"  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
                f"  GlobalKnownHostsFile /dev/null\n  BatchMode yes\n  LogLevel ERROR\n"
                f"  ConnectTimeout 10\n")
    os.makedirs(os.path.join(t, "bin"))
    with open(cluster.ssh, "w") as f:
        f.write(f'#!/bin/sh\nexec {SSH} -F {t}/ssh_config "$@"\n')
    os.chmod(cluster.ssh, 0o755)
    for i, addr in enumerate(cluster.hosts):
        with open(os.path.join(t, f"sshd-h{i}.conf"), "w") as f:
            f.write(f"ListenAddress {addr}:{SSH_PORT}\nHostKey {cluster.host_key}\n"
                    f"PidFile {t}/sshd-h{i}.pid\nAuthorizedKeysFile {t}/authorized_keys\n"
                    f"PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                    f"KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                    f"PrintMotd no\nLogLevel ERROR\nMaxStartups 64:30:128\n")


def start_sshd(cluster: Layout) -> None:
    """One sshd per host, each logging to ``sshd-hI.log`` in the temp dir."""
    for i in range(cluster.n_hosts):
        with open(os.path.join(cluster.tmpdir, f"sshd-h{i}.log"), "w") as log:
            # -D: stays in the foreground, so this Popen's pid is sshd's (ip, unshare and sh exec).
            cluster.sshd.append(jobs.popen(cluster, i, [SSHD, "-D", "-e", "-f", f"{cluster.tmpdir}/sshd-h{i}.conf"],
                                           stdout=log, stderr=subprocess.STDOUT))


def wait_for_ssh(cluster: Layout, timeout_s: float = 20.0) -> None:
    """Until host 0 can ssh to every host (itself included) and each answers its hostname."""
    pending = set(range(cluster.n_hosts))
    deadline = time.monotonic() + timeout_s
    last = ""
    while pending:
        for i, p in enumerate(cluster.sshd):
            if p.poll() is not None:
                with open(os.path.join(cluster.tmpdir, f"sshd-h{i}.log")) as f:
                    raise ClusterError(f"sshd on host {i} exited ({p.returncode}): {f.read().strip()}")
        probes = {i: jobs.popen(cluster, 0, ["ssh", cluster.hosts[i], "hostname"], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT) for i in pending}
        for i, p in probes.items():
            out = p.communicate(timeout=30)[0].strip()
            if p.returncode == 0 and out == cluster.hostnames[i]:
                pending.discard(i)
            else:
                last = f"host {i}: {out or p.returncode}"
        if pending and time.monotonic() > deadline:
            raise ClusterError(f"ssh to hosts {sorted(pending)} did not work in "
                               f"{timeout_s:.0f} s ({last})")
        if pending:
            time.sleep(0.2)
