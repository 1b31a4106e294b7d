"""Measuring the links: bulk TCP from some hosts into one, timed by the receiver. Both ends run
inside hosts as ``python -m testbed.netcluster _recv|_send`` (cli.py dispatches them)."""
from __future__ import annotations

import json
import selectors
import socket
import subprocess
import time
from typing import Sequence

from testbed.netcluster import jobs
from testbed.netcluster.layout import Layout
from testbed.netcluster.system import ClusterError

THROUGHPUT_PORT = 5201


def measure(cluster: Layout, senders: Sequence[int], receiver: int, bytes_per_sender: int = 50_000_000,
            timeout: float = 120) -> float:
    """Bits per second of TCP payload that host ``receiver`` took in while every host in
    ``senders`` sent it ``bytes_per_sender`` at once (first byte to last EOF)."""
    me = [cluster.python, "-m", "testbed.netcluster"]
    addr = cluster.hosts[receiver]
    recv = jobs.popen(cluster, receiver, [*me, "_recv", addr, str(len(senders))], stdout=subprocess.PIPE)
    try:
        if recv.stdout.readline().strip() != "ready":
            raise ClusterError(f"throughput receiver on host {receiver} did not start")
        sends = [jobs.popen(cluster, s, [*me, "_send", addr, str(bytes_per_sender)]) for s in senders]
        out, _ = recv.communicate(timeout=timeout)
        for p in sends:
            p.wait(timeout=timeout)
    except BaseException:
        jobs.kill_jobs(cluster, extra=[recv.pid])
        raise
    result = json.loads(out)
    if result["bytes"] != bytes_per_sender * len(senders):
        raise ClusterError(f"throughput: received {result['bytes']} of "
                           f"{bytes_per_sender * len(senders)} bytes")
    return result["bytes"] * 8 / result["seconds"]


# --- bulk transfer endpoints, run inside hosts by measure ---------------------------------------
def recv(addr: str, count: int) -> None:
    server = socket.create_server((addr, THROUGHPUT_PORT), backlog=count)
    print("ready", flush=True)
    sel = selectors.DefaultSelector()
    sel.register(server, selectors.EVENT_READ)
    accepted = finished = received = 0
    first = last = 0.0
    while finished < count:
        for key, _ in sel.select():
            if key.fileobj is server:
                conn, _ = server.accept()
                sel.register(conn, selectors.EVENT_READ)
                accepted += 1
                if accepted == count:
                    sel.unregister(server)
                continue
            data = key.fileobj.recv(1 << 20)
            if not first:
                first = time.perf_counter()
            if data:
                received += len(data)
            else:
                sel.unregister(key.fileobj)
                key.fileobj.close()
                finished += 1
                last = time.perf_counter()
    print(json.dumps({"bytes": received, "seconds": last - first}), flush=True)


def send(addr: str, nbytes: int) -> None:
    chunk = b"\0" * (1 << 20)
    with socket.create_connection((addr, THROUGHPUT_PORT), timeout=60) as conn:
        view = memoryview(chunk)
        while nbytes > 0:
            n = min(nbytes, len(chunk))
            conn.sendall(view[:n])
            nbytes -= n
