"""Every bad input in the fault drill (benchmarks/reliability.py), run for real: the job exits
non-zero within seconds, with one line from hvd_cifar (from one rank, even with 2 ranks) and no
traceback. The drill script prints the same cases as the table in docs/RELIABILITY.md."""
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import reliability  # noqa: E402


def test_the_drill_covers_what_the_guarantee_lists():
    names = " / ".join(case.name for case in reliability.BAD_INPUTS)
    for topic in ("unknown config key", "wrong type", "negative learning rate", "zero batch size",
                  "accumulation steps 0", "freeze beyond", "unknown model", "unknown data set",
                  "unknown sync", "malformed hostfile line", "fewer slots than -np", "data set missing",
                  "corrupt data set", "checkpoint from a different model", "checkpoint from a different config",
                  "resume of a run folder that does not exist", "unwritable log dir",
                  "larger than the data set", "not UTF-8 text", "threads per rank beyond the host's CPUs",
                  "network interface that does not exist"):
        assert topic in names, topic
    assert len(reliability.BAD_INPUTS) >= 15


@pytest.mark.slow
@pytest.mark.parametrize("case", reliability.BAD_INPUTS, ids=lambda case: case.name)
def test_bad_input_is_one_line_from_one_rank(tmp_path, case):
    result = reliability.run_bad_input(case, tmp_path)
    assert result["ok"], f"{result['why']}\n{result['stderr']}"
    assert result["exit"] not in (0, None) and result["seconds"] <= reliability.BAD_INPUT_BOUND_S
