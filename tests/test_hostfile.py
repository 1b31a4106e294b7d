import subprocess

import pytest

from conftest import PYTHON, ROOT
from hvd_cifar.launch import hostfile
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
    ("a slots=1\nb slots=1\na slots=1\n", 3, "already listed on line 1"),
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
