"""``horovodrun`` that ends in one line and never leaves its job behind:
``python -m hvd_cifar.launch.horovodrun ARGS`` is horovodrun ARGS, with three differences.

* When a rank exits non-zero, horovodrun stops the other ranks (good) and then raises from its
  own driver, printing a Python traceback of the launcher after the rank's own message. The rank
  already said what went wrong, once, so this entry point turns that ending into one line
  (``horovodrun: job stopped: ...``) naming the first failed process and exits with its status.
  Anything else horovodrun raises (a launcher fault, not a rank's) goes through untouched.
* The launcher gets SIGTERM when its parent dies (``commands.die_with_parent``), in both modes.
* A host that ssh cannot reach ends the launch with one line naming it and ssh's last word
  (``horovodrun: cannot reach host HOST by ssh: ...``, status 2) instead of horovodrun's
  per-host dump and 20-line ``RuntimeError: could not connect to some hosts via ssh`` traceback.
* An elastic job whose host discovery script fails at its first run ends with status 2 and the
  script's own line (launch/discover-hosts.sh names the hostfile's bad line), or, from a script
  that fails otherwise than with status 2, one line saying so, instead of two tracebacks (the
  driver's discovery thread's, then its own).

``launch/horovodrun.sh`` runs horovodrun this way. What plain ``horovodrun`` needs as well is
carried in the Horovod that scripts/install.sh builds (its Fix 5: MPI mode ends in ``exec
mpirun``, so a signal to the launcher's pid reaches mpirun, which stops the ranks; Fix 6: a
stopped worker's shell is continued so that it ends).
"""
from __future__ import annotations

import contextlib
import io
import re
import signal
import sys
import threading

from hvd_cifar.launch import commands

# The messages horovodrun's drivers raise after a worker failed (gloo_run.launch_gloo and
# gloo_run's elastic path; mpi_run when mpirun itself exits non-zero).
_GLOO_FAILED = re.compile(r"one or more processes exited with non-zero status.*?"
                          r"Process name: (?P<name>\S+)\s+Exit code: (?P<code>-?\d+)", re.S)
_MPIRUN_FAILED = re.compile(r"mpirun failed with exit code (?P<code>-?\d+)")


_SSH_FAILED = re.compile(r"^ssh not successful for host (?P<host>\S+):\n(?P<output>.*?)(?=^ssh not successful|\Z)",
                         re.S | re.M)
_unreachable: list[tuple[str, str]] = []  # (host, ssh's last line) from horovodrun's ssh check


def record_unreachable_hosts() -> None:
    """Wrap horovodrun's ssh check of the hosts: its per-host report (printed, then a
    RuntimeError) is kept here instead, for ``main`` to say in one line."""
    from horovod.runner import launch

    check = launch._check_all_hosts_ssh_successful

    def quiet_check(*args, **kwargs):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            ok = check(*args, **kwargs)
        for m in _SSH_FAILED.finditer(printed.getvalue()):
            lines = [line.strip() for line in m["output"].splitlines() if line.strip()]
            _unreachable.append((m["host"], lines[-1] if lines else "no output"))
        if not ok and not _unreachable:
            sys.stdout.write(printed.getvalue())
        return ok

    launch._check_all_hosts_ssh_successful = quiet_check


_DISCOVERY_FAILED = re.compile(r"^Failed to execute discovery script: (?P<script>.*)\. Exit code: (?P<code>-?\d+)$")
_failed_discovery: list[re.Match] = []  # the discovery thread's error, from the first run of the script


def record_failed_discovery() -> None:
    """Keep the error that Horovod's elastic driver raises in its discovery thread when the
    script fails at its first run (the thread's traceback, before the driver's own) for ``main``
    to say in one line; any other thread's error is printed as before."""
    previous = threading.excepthook

    def hook(args):
        if m := _DISCOVERY_FAILED.match(str(args.exc_value)):
            _failed_discovery.append(m)
        else:
            previous(args)

    threading.excepthook = hook


def status_text(code: int) -> str:
    """'143 (SIGTERM)' for a status that says a signal ended the process."""
    try:
        return f"{code} ({signal.Signals(code - 128).name})" if code > 128 else str(code)
    except ValueError:
        return str(code)


def main(argv: list[str] | None = None) -> int:
    commands.die_with_parent(commands.parent_from_env())
    from horovod.runner.launch import run_commandline

    record_unreachable_hosts()
    record_failed_discovery()

    if argv is not None:
        sys.argv[1:] = argv
    sys.argv[0] = "horovodrun"
    try:
        return run_commandline() or 0
    except RuntimeError as exc:
        text = str(exc)
        if _unreachable and "could not connect to some hosts via ssh" in text:
            for host, why in _unreachable:
                print(f"horovodrun: cannot reach host {host} by ssh: {why}", file=sys.stderr)
            return 2
        if _failed_discovery and "Job has been shutdown" in text:
            failed = _failed_discovery[0]
            if failed["code"] != "2":  # 2: the script said why itself, as launch/discover-hosts.sh does
                print(f"horovodrun: the host discovery script {failed['script']} failed at its first run "
                      f"(status {status_text(int(failed['code']))})", file=sys.stderr)
            return 2
        if m := _GLOO_FAILED.search(text):
            code = int(m["code"])
            print(f"horovodrun: job stopped: process {m['name']} exited with status {status_text(code)}",
                  file=sys.stderr)
        elif m := _MPIRUN_FAILED.search(text):
            code = int(m["code"])
            print(f"horovodrun: job stopped: mpirun exited with status {status_text(code)}", file=sys.stderr)
        else:
            raise
        # A signal death reads as a negative status; the shell convention is 128 + signal.
        return code if 0 < code < 256 else (128 - code if code < 0 else 1)


if __name__ == "__main__":
    sys.exit(main())
