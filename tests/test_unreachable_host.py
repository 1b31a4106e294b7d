"""A hostfile naming a host that ssh cannot reach: launch/horovodrun.sh ends with one line naming
the host and ssh's reason, status 2, instead of horovodrun's per-host dump and its 20-line
RuntimeError traceback (issue 22, 7b)."""
import socket
import subprocess

from conftest import ROOT, TINY

# A host that is not this one to horovodrun (no interface holds 127.0.0.2), whose ssh port
# refuses: the attempt stays on the loopback, and no name is looked up anywhere.
HOST = "127.0.0.2"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]  # closed again when the socket is


def test_an_unreachable_host_is_one_line_naming_it(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text(f"localhost slots=1\n{HOST} slots=1\n")
    port = closed_port()
    proc = subprocess.run([str(ROOT / "launch" / "horovodrun.sh"), "-np", "2", "-hostfile", str(hosts), "-p",
                           str(port), "--config", TINY], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc
    assert proc.stdout == "" and proc.stderr.splitlines() == [
        f"horovodrun: cannot reach host {HOST} by ssh: ssh: connect to host {HOST} port {port}: "
        f"Connection refused"], proc
