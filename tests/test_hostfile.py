import os
import subprocess

import pytest

from conftest import BIN, PYTHON, ROOT
from hvd_cifar.launch import commands, hostfile
from hvd_cifar.launch.hostfile import HostfileError


def write(tmp_path, text):
    path = tmp_path / "hosts"
    path.write_text(text)
    return str(path)


def test_both_formats_comments_and_blank_lines(tmp_path):
    path = write(tmp_path, "# cluster\n\nnode1 slots=2   # big one\nnode2:1\n10.1.2.3\n")
    hosts = hostfile.parse(path)
    assert hosts == [("node1", 2), ("node2", 1), ("10.1.2.3", 1)]
    assert hostfile.horovod_hosts(hosts) == "node1:2,node2:1,10.1.2.3:1"
    assert hostfile.mpi_hostfile(hosts) == "node1 slots=2\nnode2 slots=1\n10.1.2.3 slots=1\n"


@pytest.mark.parametrize("text, line, what", [
    ("node1 slots=2\nnode2 slots=two\n", 2, "cannot parse"),
    ("node1 slots=2\nnode2 cores=2\n", 2, "cannot parse"),
    ("node1 slots=0\n", 1, "0 slots"),
    ("a slots=1\nb slots=1\na slots=1\n", 3, "already listed on line 1 .*'a slots=2'"),
    ("bad host slots=1\n", 1, "cannot parse"),
])
def test_bad_lines_are_named(tmp_path, text, line, what):
    path = write(tmp_path, text)
    with pytest.raises(HostfileError, match=f"{path}:{line}: .*{what}"):
        hostfile.parse(path)


def test_empty_and_missing_files(tmp_path):
    with pytest.raises(HostfileError, match="no hosts"):
        hostfile.parse(write(tmp_path, "# nothing\n\n"))
    with pytest.raises(HostfileError, match="cannot read"):
        hostfile.parse(str(tmp_path / "absent"))


def test_fewer_slots_than_np_via_cli(tmp_path):
    path = write(tmp_path, "node1 slots=2\nnode2 slots=1\n")
    proc = subprocess.run([PYTHON, "-m", "hvd_cifar.launch.hostfile", path, "--np", "4"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"hvd_cifar: error: hostfile {path}: -np 4 needs 4 slots but the file has 3"


@pytest.mark.parametrize("script", ["launch/horovodrun.sh", "launch/mpirun.sh"])
def test_launch_scripts_refuse_a_bad_hostfile_before_launching(tmp_path, script):
    path = write(tmp_path, "localhost slots=2\nlocalhost2 slots=x\n")
    proc = subprocess.run([str(ROOT / script), "-np", "2", "-hostfile", path, "--config", "configs/tiny.yaml"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [
        f"hvd_cifar: error: hostfile {path}:2: cannot parse 'localhost2 slots=x' (expected 'HOST slots=N' or 'HOST:N')"]


def test_shipped_hostfiles_parse():
    assert hostfile.parse(str(ROOT / "hostfiles" / "localhost")) == [("localhost", 2)]
    assert len(hostfile.parse(str(ROOT / "hostfiles" / "example-cluster"))) == 4


# ----------------------------------------------------------------------------- one rule set, every launcher
# Files that break the rules, each with the line every launcher says after its own prefix.
BAD_FILES = [
    ("a host twice, with slots", "localhost slots=1\nlocalhost slots=1\n",
     "{path}:2: localhost already listed on line 1 (list each host once, with all its slots: 'localhost slots=2')"),
    ("a host twice, bare", "# two lines, one slot each\nlocalhost\n\nlocalhost:1\n",
     "{path}:4: localhost already listed on line 2 (list each host once, with all its slots: 'localhost slots=2')"),
    ("a line that does not parse", "localhost slots=2\nnode2 slots two\n",
     "{path}:2: cannot parse 'node2 slots two' (expected 'HOST slots=N' or 'HOST:N')"),
    ("zero slots", "localhost slots=0\n", "{path}:1: localhost has 0 slots; need at least 1"),
    ("no hosts", "# nobody\n\n", "{path}: no hosts listed"),
]
# Each launcher the product offers that reads a hostfile: its command for a file (elastic jobs:
# HVD_CIFAR_HOSTFILE), and the prefix of its one line. horovodrun is the Horovod that
# scripts/install.sh builds (its Fix 10 reads the file with hvd_cifar.launch.hostfile), plain and
# through hvd_cifar.launch.horovodrun.
LAUNCHERS = {
    "launch/horovodrun.sh": (lambda f: [str(ROOT / "launch" / "horovodrun.sh"), "-np", "2", "-hostfile", f,
                                        "--config", "configs/tiny.yaml"], "hvd_cifar: error: hostfile "),
    "launch/mpirun.sh": (lambda f: [str(ROOT / "launch" / "mpirun.sh"), "-np", "2", "-H", f,
                                    "--config", "configs/tiny.yaml"], "hvd_cifar: error: hostfile "),
    "horovodrun -H": (lambda f: [str(BIN / "horovodrun"), "-np", "2", "-H", f, PYTHON, "-c", "pass"],
                      "horovodrun: error: hostfile "),
    "horovodrun -hostfile --gloo": (lambda f: [str(BIN / "horovodrun"), "-np", "2", "-hostfile", f, "--gloo",
                                               PYTHON, "-c", "pass"], "horovodrun: error: hostfile "),
    "python -m hvd_cifar.launch.horovodrun": (
        lambda f: [PYTHON, "-m", "hvd_cifar.launch.horovodrun", "-np", "2", "-H", f, PYTHON, "-c", "pass"],
        "horovodrun: error: hostfile "),
    "launch/discover-hosts.sh (elastic)": (lambda f: [str(ROOT / "launch" / "discover-hosts.sh")],
                                           "hvd_cifar: error: hostfile "),
    "elastic python -m hvd_cifar.launch.horovodrun": (lambda f: [
        PYTHON, "-m", "hvd_cifar.launch.horovodrun", "-np", "2", "--min-np", "2", "--max-np", "2",
        "--host-discovery-script", str(ROOT / "launch" / "discover-hosts.sh"), PYTHON, "-c", "pass"],
        "hvd_cifar: error: hostfile "),
}


@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("what, text, says", BAD_FILES, ids=[f[0] for f in BAD_FILES])
def test_every_launcher_refuses_the_same_hostfile_with_the_same_line(tmp_path, launcher, what, text, says):
    """The same file, the same verdict and the same words whichever launcher reads it: status 2
    and one line, before any rank starts."""
    path = write(tmp_path, text)
    argv, prefix = LAUNCHERS[launcher]
    proc = subprocess.run(argv(path), cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, HVD_CIFAR_HOSTFILE=path))
    assert (proc.returncode, proc.stdout) == (2, ""), proc
    assert proc.stderr.splitlines() == [prefix + says.format(path=path)], proc.stderr


def test_the_discovery_script_prints_a_good_files_hosts_by_the_same_rules(tmp_path):
    path = write(tmp_path, "# cluster\n\nnode1 slots=2   # big one\nnode2:1\n10.1.2.3\n")
    proc = subprocess.run([str(ROOT / "launch" / "discover-hosts.sh")], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, HVD_CIFAR_HOSTFILE=path))
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "node1:2\nnode2:1\n10.1.2.3:1\n", "")


def test_open_mpis_own_mpirun_reads_a_hostfile_by_its_own_rules(tmp_path):
    """What docs/LAUNCHING.md says of plain ``mpirun --hostfile``, which reads the file itself:
    a bare host on two lines is two slots of it, where every launcher above refuses the file."""
    path = write(tmp_path, "localhost\nlocalhost\n")
    proc = subprocess.run([*commands.mpirun(2, ["true"], hostfile=path, oversubscribe=False)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
