"""``horovodrun`` with a one-line ending: ``python -m hvd_cifar.horovodrun ARGS`` is horovodrun ARGS.

When a rank exits non-zero, horovodrun stops the other ranks (good) and then raises from its
own driver, printing a Python traceback of the launcher after the rank's own message. The rank
already said what went wrong, once, so this entry point turns that ending into one line (``horovodrun: job stopped: ...``) naming
the first failed process and exits with its status. Anything else horovodrun raises (a launcher
fault, not a rank's) goes through untouched. ``launch/horovodrun.sh`` runs horovodrun this way.
"""
from __future__ import annotations

import re
import sys

# The messages horovodrun's drivers raise after a worker failed (gloo_run.launch_gloo and
# gloo_run's elastic path; mpi_run when mpirun itself exits non-zero).
_GLOO_FAILED = re.compile(r"one or more processes exited with non-zero status.*?"
                          r"Process name: (?P<name>\S+)\s+Exit code: (?P<code>-?\d+)", re.S)
_MPIRUN_FAILED = re.compile(r"mpirun failed with exit code (?P<code>-?\d+)")


def main(argv: list[str] | None = None) -> int:
    from horovod.runner.launch import run_commandline

    if argv is not None:
        sys.argv[1:] = argv
    sys.argv[0] = "horovodrun"
    try:
        return run_commandline() or 0
    except RuntimeError as exc:
        text = str(exc)
        if m := _GLOO_FAILED.search(text):
            code = int(m["code"])
            print(f"horovodrun: job stopped: process {m['name']} exited with status {code}",
                  file=sys.stderr)
        elif m := _MPIRUN_FAILED.search(text):
            code = int(m["code"])
            print(f"horovodrun: job stopped: mpirun exited with status {code}", file=sys.stderr)
        else:
            raise
        # A signal death reads as a negative status; the shell convention is 128 + signal.
        return code if 0 < code < 256 else (128 - code if code < 0 else 1)


if __name__ == "__main__":
    sys.exit(main())
