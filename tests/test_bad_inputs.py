"""Every bad input of the fault drill (testbed.drill; benchmarks/reliability.py runs them all
for real and prints the table in docs/RELIABILITY.md): one line from hvd_cifar, and no traceback.

Mistakes in the config alone are checked in-process, in milliseconds: the trainer's own
``load_config`` on the case's own flags and files raises one of the errors the trainer turns
into its one line, and that line holds what the drill expects. Two of them still run as real
2-rank jobs (one under mpirun, one under horovodrun), for the guarantee that matters there: one
line from one rank, under a real launcher. Every other case (hostfiles, data sets, checkpoints,
run folders, launchers, the host's CPUs and interfaces, divergence) is launched for real."""
import pytest

from hvd_cifar import train
from hvd_cifar.trainer.ranks import USER_ERRORS

from testbed import drill

CONFIG_ERRORS = [case for case in drill.BAD_INPUTS if case.config_error]
# Config errors that still run as real jobs: one line from one rank under mpirun -np 2 and horovodrun.
LAUNCHED_CONFIG_ERRORS = ("unknown config key (flag)", "accumulation steps of the wrong type, under horovodrun (MPI)")
IN_PROCESS = [case for case in CONFIG_ERRORS if case.name not in LAUNCHED_CONFIG_ERRORS]
LAUNCHED = [case for case in drill.BAD_INPUTS if case not in IN_PROCESS]


def test_the_drill_covers_what_the_guarantee_lists():
    names = " / ".join(case.name for case in drill.BAD_INPUTS)
    for topic in ("unknown config key", "wrong type", "negative learning rate", "zero batch size",
                  "accumulation steps 0", "freeze beyond", "unknown model", "unknown data set",
                  "unknown sync", "malformed hostfile line", "fewer slots than -np", "data set missing",
                  "corrupt data set", "checkpoint from a different model", "checkpoint from a different config",
                  "resume of a run folder that does not exist", "unwritable log dir",
                  "larger than the data set", "not UTF-8 text", "threads per rank beyond the host's CPUs",
                  "network interface that does not exist"):
        assert topic in names, topic
    assert len(drill.BAD_INPUTS) >= 15
    assert set(LAUNCHED_CONFIG_ERRORS) <= {case.name for case in CONFIG_ERRORS}
    assert len(IN_PROCESS) >= 12 and len(LAUNCHED) + len(IN_PROCESS) == len(drill.BAD_INPUTS)


@pytest.mark.parametrize("case", IN_PROCESS, ids=lambda case: case.name)
def test_config_error_is_the_drills_one_line(tmp_path, case):
    """What the trainer does with these flags before anything else, in this process: the error
    it prints as ``hvd_cifar: error: ...`` (train.main), one line holding the drill's text."""
    case.prepare(tmp_path)
    with pytest.raises(USER_ERRORS) as raised:
        train.load_config(case.trainer_flags(tmp_path))
    line = f"hvd_cifar: error: {raised.value}"
    assert "\n" not in line and case.expect in line, line


@pytest.mark.slow
@pytest.mark.parametrize("case", LAUNCHED, ids=lambda case: case.name)
def test_bad_input_is_one_line_from_one_rank(tmp_path, case):
    """The drill's case under the suite's slack on its time bound (testbed.drill.SUITE_SLACK)."""
    bound_s = drill.SUITE_SLACK * drill.BAD_INPUT_BOUND_S
    result = drill.run_bad_input(case, tmp_path, bound_s=bound_s)
    assert result["ok"], f"{result['why']}\n{result['stderr']}"
    assert result["exit"] == case.status and result["seconds"] <= bound_s


@pytest.mark.slow
def test_bad_input_under_ddp_ends_with_its_status_every_time(tmp_path):
    """Bad input found after DDP's process group is up (a run name already taken): each of 8
    jobs ends with status 2 and one line. Ended through the interpreter's shutdown, with
    Gloo's threads still letting go of tensors, about one such job in six aborted (SIGABRT,
    status 134, a native stack from Open MPI)."""
    case = next(case for case in drill.BAD_INPUTS if case.name == "run name that already exists, under DDP")
    bound_s = drill.SUITE_SLACK * drill.BAD_INPUT_BOUND_S
    for attempt in range(8):
        result = drill.run_bad_input(case, tmp_path / str(attempt), bound_s=bound_s)
        assert result["ok"], f"job {attempt + 1}: {result['why']}\n{result['stderr']}"
