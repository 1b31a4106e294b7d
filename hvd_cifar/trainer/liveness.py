"""A host that drops off the network (link down, a partition) while its processes live on is
named within ``liveness_timeout_s``, and the job ends.

Open MPI's TCP transport and Gloo wait on a silent peer for as long as TCP retransmits (about
15 minutes), and mpirun, once told to end a job, waits as long for the daemon of the host it
cannot reach. So every rank keeps a heartbeat of its own with rank 0, on a TCP connection beside
the sync method's, in a daemon thread that the training never waits on:

    rank 0   listens on a free port; every rank learns it from the sync method's broadcast
    rank r   connects to rank 0's host (MASTER_ADDR, or its host name, else an address of its
             interfaces), says "r HOSTNAME"
    both     send one byte per interval (liveness_timeout_s / 10, at most 1 s) on each
             connection they hold, and read what comes

A connection quiet for ``liveness_timeout_s`` is a lost host. One that closes is a process that
ended (the run's end, an abort, a kill), which the launcher already handles: no alarm. The
thread judges only after it has read what is waiting, so a thread that was kept from running
(a long call holding Python's lock; torch's ops and the sync methods' waits release it) never
counts its peers' queued bytes as silence.

Rank 0, when a rank goes quiet, appends a ``host_lost`` event to the run folder's events.jsonl
and says one line naming the host and rank; every other rank, when rank 0 goes quiet, says a line
of its own (from a host that is cut off it reaches no one); then each ends the job from where it
is, with status 1 (a fault: trainer.exits):

* a rank that mpirun started itself (rank 0's host is mpirun's, as the launchers place it)
  kills mpirun and what mpirun started on this host (the other ranks here, its ssh clients).
  MPI_Abort would leave mpirun waiting for the unreachable daemon; Open MPI's daemons on the
  hosts still reachable see mpirun go and stop their ranks;
* a rank under an Open MPI daemon (orted) that lost rank 0 stops that daemon (SIGTERM), which
  stops the daemon's other ranks; any other rank that lost rank 0 exits (its launcher sees it);
* rank 0 anywhere else (horovodrun --gloo, srun, under a daemon) ``lifecycle.abort_job``.

Off when ``liveness_timeout_s`` is 0, for one process, and under elastic training (Horovod's
elastic driver handles a worker that goes away).
"""
from __future__ import annotations

import os
import select
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

import psutil

from hvd_cifar.core import launcher, lifecycle
from hvd_cifar.core.errors import ConfigError
from hvd_cifar.runfolder import reader, writer

EXIT_HOST_LOST = 1          # a fault, not bad input (trainer.exits)
CONNECT_TIMEOUT_S = 30.0    # for every rank to reach rank 0's port at the start
BEAT = b"."
# The processes a rank's parent may be: Open MPI's launcher (which runs the ranks of its own
# host) and its daemon on every other host.
MPI_LAUNCHERS = ("mpirun", "mpiexec", "orterun", "prterun")
MPI_DAEMONS = ("orted", "prted")
FORWARD_S = 1.0             # for mpirun to pass the rank's line on before it is stopped
FOLDER_WAIT_S = 3.0         # for the run folder's event and note: a folder that hangs must not hang the end
ABORT_WAIT_S = 10.0         # for MPI_Abort to end this rank before it exits by itself
# A connection that fails so is a process that ended (its host answered); any other error is
# left to the silence to judge.
GONE = (ConnectionResetError, ConnectionAbortedError, BrokenPipeError)


@dataclass
class Peer:
    sock: socket.socket
    rank: int
    host: str
    heard: float = 0.0      # time.monotonic() of the last byte from it


def interval_s(timeout_s: float) -> float:
    return min(1.0, timeout_s / 10)


# ----------------------------------------------------------------------------- connecting
def start(timeout_s: float, sync, run_dir: str) -> Monitor | None:
    """Connect every rank to rank 0 and start the watch; None when it is off. Every rank calls it
    at the same point (it uses the sync method's collectives); a rank that cannot connect stops
    every rank with one line from rank 0 (a ConfigError)."""
    if not timeout_s or sync.size == 1 or sync.elastic:
        return None
    here = socket.gethostname()
    listener = socket.create_server(("", 0), backlog=sync.size) if sync.rank == 0 else None
    try:
        rank0 = sync.broadcast_object((here, addresses(here), listener.getsockname()[1]) if listener else None)
        peers, error = connect(sync, listener, rank0, here)
    finally:
        if listener:
            listener.close()
    if error:
        for peer in peers:
            peer.sock.close()
        raise ConfigError(f"liveness_timeout_s: the ranks' heartbeat could not start: {error}; the ranks "
                          f"must reach rank 0's host (MASTER_ADDR names the address to use)",
                          fixes=(["--liveness-timeout-s", "0"],))
    monitor = Monitor(peers, timeout_s, sync.rank, run_dir)
    monitor.start()
    return monitor


def addresses(here: str) -> list[str]:
    """Where the other ranks may reach rank 0: MASTER_ADDR alone when it is set; else the host
    name the launcher used for rank 0, then the IPv4 address of each of this host's interfaces
    (a host name that the other hosts do not resolve still leaves those), loopback last."""
    if os.environ.get("MASTER_ADDR"):
        return [os.environ["MASTER_ADDR"]]
    own = [a.address for found in psutil.net_if_addrs().values() for a in found if a.family == socket.AF_INET]
    return list(dict.fromkeys([launcher.rendezvous_host(here), *sorted(own, key=lambda a: a.startswith("127."))]))


def connect(sync, listener: socket.socket | None, rank0: tuple[str, list[str], int], here: str
            ) -> tuple[list[Peer], str]:
    """Every rank but 0 connects (the connections wait in rank 0's backlog), they agree on
    whether all did, then rank 0 takes them: (this rank's peers, the error all ranks share, or
    "")."""
    peers: list[Peer] = []
    error = ""
    if listener is None:
        try:
            peers = [dial(rank0, sync.rank, here)]
        except OSError as exc:
            error = (f"rank {sync.rank} on {here} cannot reach rank 0 at {', '.join(rank0[1])}:{rank0[2]} "
                     f"({exc.strerror or exc or type(exc).__name__})")
    error = next((e for e in sync.allgather_object(error) if e), "")
    if not error:
        if listener:
            try:
                peers = accept_all(listener, sync.size - 1)
            except OSError as exc:
                error = str(exc) or type(exc).__name__
        error = sync.broadcast_object(error)
    return peers, error


def dial(rank0: tuple[str, list[str], int], rank: int, here: str) -> Peer:
    """Rank ``rank``'s connection to rank 0 (its host name, the addresses to try in turn, the
    port), announced with this rank and host name; the last address's error when none answers."""
    name, candidates, port = rank0
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    for i, address in enumerate(candidates):
        try:
            sock = socket.create_connection((address, port), timeout=max(0.1, min(5.0, deadline - time.monotonic())))
            break
        except OSError:
            if i == len(candidates) - 1 or time.monotonic() > deadline:
                raise
    sock.sendall(f"{rank} {here}\n".encode())
    sock.setblocking(False)
    return Peer(sock, 0, name)


def accept_all(listener: socket.socket, count: int) -> list[Peer]:
    """Rank 0: the connections of ranks 1..``count``, each with the host it announced (a
    connection that announces no rank of the job, or one already connected, is closed)."""
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    peers: dict[int, Peer] = {}
    try:
        while len(peers) < count:
            listener.settimeout(max(0.01, deadline - time.monotonic()))
            sock, _ = listener.accept()
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            hello = b""
            while not hello.endswith(b"\n") and len(hello) < 512:
                hello += sock.recv(512) or b"\n"
            rank, _, host = hello.decode(errors="replace").strip().partition(" ")
            if not (rank.isdigit() and 1 <= int(rank) <= count and int(rank) not in peers):
                sock.close()
                continue
            sock.setblocking(False)
            peers[int(rank)] = Peer(sock, int(rank), host)
    except TimeoutError:
        for peer in peers.values():
            peer.sock.close()
        missing = ", ".join(str(r) for r in range(1, count + 1) if r not in peers)
        raise TimeoutError(f"rank(s) {missing} did not connect within {CONNECT_TIMEOUT_S:.0f} s") from None
    return [peers[rank] for rank in sorted(peers)]


def stop(monitor: Monitor | None) -> None:
    """The run ended on this rank: end the watch (its peers see the connections close: no alarm)."""
    if monitor:
        monitor.stop()


# ----------------------------------------------------------------------------- the watch
class Monitor:
    """One rank's heartbeat connections (rank 0: one per other rank; the others: the one to
    rank 0), watched by a daemon thread; ``lost`` is what it does when some go quiet."""

    def __init__(self, peers: list[Peer], timeout_s: float, rank: int, run_dir: str,
                 lost: Callable[[Monitor, list[Peer]], None] | None = None):
        self.peers, self.timeout_s, self.rank, self.run_dir = peers, timeout_s, rank, run_dir
        self.interval_s = interval_s(timeout_s)
        self.lost = lost or end_the_job
        self._wake_reader, self._wake = socket.socketpair()  # stop() wakes the thread at once
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="hvd_cifar-liveness", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.send(b"x")
        self._thread.join(timeout=5)
        for sock in (*(p.sock for p in self.peers), self._wake_reader, self._wake):
            sock.close()

    def _watch(self) -> None:
        try:
            silent = self._until_silence()
        except (OSError, ValueError):  # only when stop() closed a socket under the thread
            if not self._stopped.is_set():
                raise
            return
        if silent and not self._stopped.is_set():
            self.lost(self, silent)

    def _until_silence(self) -> list[Peer]:
        """Read, beat and judge until some peer has been quiet for timeout_s (those peers), every
        peer has closed, or stop() (both: [])."""
        watched = list(self.peers)
        now = time.monotonic()
        for peer in watched:
            peer.heard = now
        beat_at = now
        while watched and not self._stopped.is_set():
            ready, _, _ = select.select([self._wake_reader, *(p.sock for p in watched)], [], [], self.interval_s)
            now = time.monotonic()
            watched = [p for p in watched if p.sock not in ready or received(p, now)]
            if now >= beat_at:
                watched = [p for p in watched if beat(p)]
                beat_at = now + self.interval_s
            silent = [p for p in watched if now - p.heard > self.timeout_s]
            if silent:
                return silent
        return []


def received(peer: Peer, now: float) -> bool:
    """Read what ``peer`` sent; False when its process ended (closed, reset)."""
    try:
        if not peer.sock.recv(4096):
            return False
    except BlockingIOError:
        return True
    except GONE:
        return False
    except OSError:  # an unreachable host's error: the silence judges
        return True
    peer.heard = now
    return True


def beat(peer: Peer) -> bool:
    """One heartbeat to ``peer``; False when its process ended."""
    try:
        peer.sock.send(BEAT)
    except GONE:
        return False
    except OSError:  # a full buffer (it reads nothing), an unreachable host: the silence judges
        pass
    return True


# ----------------------------------------------------------------------------- ending the job
def end_the_job(monitor: Monitor, silent: list[Peer]) -> None:
    """Say which host went quiet (rank 0: also into events.jsonl), then end the job from here."""
    timeout = f"{monitor.timeout_s:g} s"
    if monitor.rank == 0:
        note = within(FOLDER_WAIT_S, lambda: record_loss(monitor.run_dir, silent, monitor.timeout_s),
                      f"continue with --resume {monitor.run_dir}")
        line = f"hvd_cifar: error: {named(silent)} stopped answering for {timeout}: {cut_off(silent)}; {note}"
    else:
        line = (f"hvd_cifar: rank {monitor.rank} stopped: rank 0 (host {silent[0].host}) has not answered for "
                f"{timeout}: this host's link is down or it is partitioned from rank 0's")
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    end_job_from_here(EXIT_HOST_LOST, speaker=monitor.rank == 0)


def named(silent: list[Peer]) -> str:
    """'host h1 (rank 1)', 'hosts h1 (ranks 1, 2) and h2 (rank 3)'."""
    hosts: dict[str, list[int]] = {}
    for peer in silent:
        hosts.setdefault(peer.host, []).append(peer.rank)
    each = [f"{host} ({'ranks' if len(ranks) > 1 else 'rank'} {', '.join(map(str, ranks))})"
            for host, ranks in hosts.items()]
    return ("host " if len(each) == 1 else "hosts ") + (" and ".join([", ".join(each[:-1]), each[-1]])
                                                       if len(each) > 1 else each[0])


def cut_off(silent: list[Peer]) -> str:
    if len({peer.host for peer in silent}) == 1:
        return "its link is down or it is partitioned"
    return "their links are down, or rank 0's host is cut off from them"


def record_loss(run_dir: str, silent: list[Peer], timeout_s: float) -> str:
    """The ``host_lost`` event, and what the run folder holds to continue from."""
    saved = [r["epoch"] for r in reader.read_metrics(run_dir, missing_ok=True).records if "checkpoint_time_s" in r]
    writer.append_metrics(run_dir, {"event": "host_lost", "time": time.time(), "hosts": sorted({p.host for p in silent}),
                                    "ranks": [p.rank for p in silent], "silent_s": timeout_s,
                                    "checkpoint_epoch": saved[-1] + 1 if saved else None, **launcher.slurm_facts()},
                          writer.EVENTS)
    if not saved:
        return f"no epoch was checkpointed yet: start the run again (run folder {run_dir})"
    return f"the run folder keeps the checkpoint of epoch {saved[-1] + 1}: continue with --resume {run_dir}"


def within(seconds: float, fn: Callable[[], str], otherwise: str) -> str:
    """``fn()`` if it returns within ``seconds`` without an error, else ``otherwise``: the run
    folder's part of the end is best effort (full, unreadable, or on a host that went too)."""
    box = [otherwise]

    def call() -> None:
        try:
            box[0] = fn()
        except Exception:  # noqa: BLE001 - whatever it was, the job still has to end
            pass
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    return box[0]


def process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return found


def end_job_from_here(code: int, speaker: bool) -> None:
    """End the job from this rank, whose peers (some of them) cannot be reached, and exit
    ``code`` (see the module's docstring for why each way)."""
    parent = os.getppid()
    name = process_name(parent)
    if name in MPI_LAUNCHERS:
        time.sleep(FORWARD_S)
        started = [pid for pid in children(parent) if pid != os.getpid()]
        for pid in (parent, *started):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    elif not speaker:  # this side is cut off: nothing to tell anyone, only to end
        if name in MPI_DAEMONS:
            os.kill(parent, signal.SIGTERM)
    else:
        # MPI_Abort may wait on a launcher that waits on the unreachable host: this rank exits anyway.
        threading.Timer(ABORT_WAIT_S, os._exit, (code,)).start()
        lifecycle.abort_job(code)
    os._exit(code)
