"""Real Ray for the tests, kept out of the pytest process.

Ray nodes run as ``ray start --block`` in process groups of their own, and every Ray driver
in a spawned process of its own (:class:`RayDriver`): a driver's core worker ends its
process on any fatal error of its own (``std::_Exit(1)``, a failed internal check, its raylet
gone), which inside pytest ends the whole run in silence, its message lost to the output
capture; and a driver's threads outlive ``ray.shutdown()``, opening sockets now and then,
which the fd counts of later tests would see.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from convert import ConvertResult, convert_folder

RAY = str(Path(sys.executable).with_name("ray"))
STARTED = b"Ray runtime started"
START_S = 60
NO_AUTH = {"RAY_AUTH_MODE": "disabled"}  # loopback only: no cluster token to hand around


NODE_PORTS = (
    "--node-manager-port",
    "--object-manager-port",
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
    "--runtime-env-agent-port",
    "--metrics-export-port",
)


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports nothing listens on, bound all at once: one free port
    drawn after another can be the same port again, and Ray refuses to start when two of
    its components share one ("... is trying to use a port number that is used by other
    components")."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


def start_node(
    args: list[str], ports: list[int], folder: Path, env: dict[str, str], cpus: int
) -> subprocess.Popen:
    """``ray start --block ...`` in a process group of its own, once it says it started;
    ``ports`` for its components (NODE_PORTS, in order).
    Its session files go into ``folder`` (short: Ray's socket paths must fit in 107
    bytes), as does the cluster address that ``ray start`` leaves for a bare
    ``ray.init()``: in the default ``/tmp/ray`` it would send every later ``ray.init()``
    on this machine (other tests, other users) to this cluster, stopped."""
    folder.mkdir()
    log = folder / "ray-start.log"
    command = [RAY, "start", "--block", f"--num-cpus={cpus}", "--disable-usage-stats", *args]
    command += [f"{flag}={port}" for flag, port in zip(NODE_PORTS, ports, strict=True)]
    command += [f"--object-store-memory={100 << 20}", f"--temp-dir={folder}"]
    with open(log, "wb") as out:
        node = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**env, **NO_AUTH},
            start_new_session=True,
        )
    deadline = time.monotonic() + START_S
    while STARTED not in log.read_bytes():
        if node.poll() is not None or time.monotonic() > deadline:
            stop_nodes([node])
            raise RuntimeError(f"ray start failed: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.1)
    return node


def stop_nodes(nodes: list[subprocess.Popen]) -> None:
    """Stop each node as ``ray start --block`` does on SIGTERM (its raylet, its workers...),
    then kill whatever is left in its process group."""
    for node in nodes:
        with contextlib.suppress(ProcessLookupError):
            node.terminate()
    for node in nodes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pid, signal.SIGKILL)
        node.wait(timeout=10)


@contextlib.contextmanager
def ray_cluster(
    env: dict[str, str], head_cpus: int, worker_resource: str | None = None
) -> Iterator[str]:
    """A head node with ``head_cpus`` CPUs and, with ``worker_resource``, a worker node of
    one CPU that has that resource; their processes started with ``env``. Yields the head's
    address. Only these nodes are stopped afterwards (never ``ray stop``, which stops every
    Ray instance on the machine), and their files removed."""
    k = len(NODE_PORTS)
    port, dashboard, *node_ports = free_ports(2 + 2 * k)  # every port of both nodes distinct
    head_args = ["--head", f"--port={port}", "--include-dashboard=false"]
    head_args += [f"--dashboard-port={dashboard}"]
    with tempfile.TemporaryDirectory(prefix="imgpack-ray-", dir="/tmp") as folder:
        nodes = [start_node(head_args, node_ports[:k], Path(folder, "head"), env, head_cpus)]
        try:
            address = f"127.0.0.1:{port}"
            if worker_resource is not None:
                worker_args = [f"--address={address}", f'--resources={{"{worker_resource}": 1}}']
                worker = start_node(worker_args, node_ports[k:], Path(folder, "worker"), env, 1)
                nodes.append(worker)
            yield address
        finally:
            stop_nodes(nodes)


class RayDriver:
    """Conversions on the Ray cluster at ``address``, run by a driver in a spawned process
    (one, kept between runs) with this process's environment as it is at the first run. A
    driver that dies fails the run that was in it (BrokenProcessPool), and the next run
    gets a new one."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._pool: ProcessPoolExecutor | None = None

    def convert(self, *args: Any, **kw: Any) -> ConvertResult:
        """:func:`convert.convert_folder` ``(*args, **kw)`` on the cluster; its error, raised."""
        return self.call(convert_folder, *args, executor="ray", ray_address=self.address, **kw)

    def call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        """``fn(*args, **kw)`` in the driver process (``fn`` importable by its name)."""
        if self._pool is None:
            spawn = multiprocessing.get_context("spawn")
            environment = {**os.environ, **NO_AUTH}
            self._pool = ProcessPoolExecutor(
                1, mp_context=spawn, initializer=_set_environment, initargs=(environment,)
            )
        try:
            return self._pool.submit(fn, *args, **kw).result()
        except BrokenProcessPool:  # the driver died: its successor starts afresh
            self.close()
            raise

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _set_environment(environment: dict[str, str]) -> None:
    os.environ.update(environment)


def convert_logging_nodes(*args: Any, **kw: Any) -> tuple[ConvertResult, list[dict], list]:
    """In a driver process: :func:`convert.convert_folder` on the cluster it joins, with the
    cluster's live nodes and the Ray executor's debug records (``record.args``) of the run."""
    import ray

    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("convert.executors.ray_tasks")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    ray.init(address=kw["ray_address"], log_to_driver=False)
    try:
        nodes = [n for n in ray.nodes() if n["Alive"]]
        result = convert_folder(*args, **kw)
    finally:
        ray.shutdown()
        logger.removeHandler(handler)
    return result, nodes, [r.args for r in records]
