"""What a person reads under a launcher: horovodrun tags every line a rank prints
(``[1,0]<stdout>:`` under MPI), so each line from rank 0 must reach the launcher in one write
with its newline. A newline written on its own arrives as a tag of its own at the end of the
line before (``...threads/rank=1[1,0]<stdout>:``)."""
from __future__ import annotations

import re

TAG = re.compile(r"\[\d+(?:,\d+)?\]<std(?:out|err)>:")  # [JOB,RANK] under MPI, [RANK] under Gloo
LOG_PREFIX = re.compile(r"^\d\d:\d\d:\d\d \[rank 0\] ")   # writer.RankLog's, on a message's first line


def test_each_line_from_rank_0_arrives_whole_under_horovodrun(tiny_run):
    proc, run = tiny_run("horovodrun").proc, tiny_run("horovodrun").run  # 2 ranks, 2 epochs
    lines = proc.stdout.splitlines()
    assert len(lines) > 5, proc.stdout
    for line in lines:
        tags = TAG.findall(line)
        assert len(tags) == 1 and line.startswith(tags[0]), f"a line not whole: {line!r}"
    # What came out is what rank 0 logged, line for line (blank lines of a message included).
    printed = [TAG.sub("", line, count=1) for line in lines]
    logged = [LOG_PREFIX.sub("", line) for line in (run / "rank0.log").read_text().splitlines()]
    assert printed == logged


def test_progress_into_a_pipe_is_plain_lines_not_frames(one_epoch_run):
    """With stderr not a terminal (a launcher's pipe, a log file), the progress bar prints a
    whole line now and then instead of carriage-return frames."""
    proc = one_epoch_run.proc  # one process, 1 epoch of 6 steps, --progress true (conftest)
    assert "\r" not in proc.stderr, repr(proc.stderr[:500])
    assert "epoch 1/1: step 6/6" in proc.stderr, proc.stderr
