"""A hostfile naming a host that ssh cannot reach: launch/horovodrun.sh ends with one line naming
the host and ssh's reason, status 2, instead of horovodrun's per-host dump and its 20-line
RuntimeError traceback (issue 22, 7b)."""
import subprocess

from conftest import ROOT, TINY


def test_an_unreachable_host_is_one_line_naming_it(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost slots=1\nno-such-host.invalid slots=1\n")
    proc = subprocess.run([str(ROOT / "launch" / "horovodrun.sh"), "-np", "2", "-hostfile", str(hosts),
                           "--config", TINY], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc
    assert proc.stdout == "" and proc.stderr.splitlines() == [
        "horovodrun: cannot reach host no-such-host.invalid by ssh: ssh: Could not resolve hostname "
        "no-such-host.invalid: Name or service not known"], proc
