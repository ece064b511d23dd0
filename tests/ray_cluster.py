"""A real two-node Ray cluster on this machine for the tests (the ``cluster`` fixture, one
per session, registered in conftest.py).

It is started the way a user starts one: ``ray start --head`` and a second ``ray start
--address=...``, each node with one CPU, a small object store and its own short temporary
directory. It is torn down by killing exactly its processes (the process group each ``ray
start`` created, and the workers its raylets spawned, which sit in process groups of their
own), not with ``ray stop``, which would stop every Ray instance of the user on the machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
OBJECT_STORE_BYTES = 100 * 1024 * 1024  # about Ray's minimum (75 MiB); results are tiny


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def node_environment() -> dict[str, str]:
    """This environment, with the worktree and tests/ first on PYTHONPATH (Ray's workers
    import the unit functions by name) and Ray's usage statistics off."""
    # RAY_AUTH_MODE: once ~/.ray/auth_token exists (Ray 2.60 writes it when a local instance
    # first starts), a head started without it requires the token while a joining node
    # sends none; a loopback test cluster runs without token authentication
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    env.pop("RAY_ADDRESS", None)
    paths = [str(ROOT), str(TESTS), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def ray_start(args: list[str], temp_dir: str, env: dict[str, str]) -> int:
    """``ray start ARGS`` in a new session; the id of the process group that holds the
    node's processes (``ray start`` itself exits once they are up)."""
    command = [sys.executable, "-m", "ray.scripts.scripts", "start", *args, f"--temp-dir={temp_dir}"]
    command += [f"--object-store-memory={OBJECT_STORE_BYTES}", "--num-cpus=1", "--disable-usage-stats"]
    command += [f"--dashboard-agent-listen-port={free_port()}", f"--metrics-export-port={free_port()}"]
    process = subprocess.Popen(
        command, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    output, _ = process.communicate(timeout=120)
    if process.returncode != 0:
        raise RuntimeError(f"ray start failed ({process.returncode}):\n{output[-3000:]}")
    return process.pid


def processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group id) of every process on the machine."""
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # exited meanwhile
            table[int(entry.name)] = (int(fields[1]), int(fields[2]))
    return table


def cluster_processes(groups: set[int]) -> set[int]:
    """The processes in ``groups`` and all their descendants (Ray's workers)."""
    table = processes()
    found = {pid for pid, (_, group) in table.items() if group in groups}
    while True:
        children = {pid for pid, (parent, _) in table.items() if parent in found} - found
        if not children:
            return found
        found |= children


def kill_cluster(groups: set[int]) -> None:
    """SIGKILL every process of the cluster, until none is left (a raylet can spawn a
    worker while it is being killed); zombies (reaped by init) do not count."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        alive = {pid for pid in cluster_processes(groups) if not is_zombie(pid)}
        if not alive:
            return
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.5)
    raise RuntimeError(f"Ray processes {sorted(cluster_processes(groups))} would not stop")


def is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True  # gone


@pytest.fixture(scope="session")
def cluster() -> Iterator[str]:
    """A head and a worker node of one CPU each; yields the address to join."""
    pytest.importorskip("ray")
    env = node_environment()
    port = free_port()
    temp_dirs = [tempfile.mkdtemp(prefix="r", dir="/tmp") for _ in range(2)]  # socket paths <= 107 bytes
    groups: set[int] = set()
    try:
        head = ["--head", f"--port={port}", "--include-dashboard=false"]
        head += [f"--ray-client-server-port={free_port()}", f"--dashboard-port={free_port()}"]
        groups.add(ray_start(head, temp_dirs[0], env))
        groups.add(ray_start([f"--address=127.0.0.1:{port}"], temp_dirs[1], env))
        yield f"127.0.0.1:{port}"
    finally:
        kill_cluster(groups)
        for directory in temp_dirs:
            shutil.rmtree(directory, ignore_errors=True)


def unit_workers() -> list[int]:
    """Pids of Ray worker processes running a unit right now (their title names the task)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if title.startswith("ray::sinkscope:"):  # the task name run_units gives each unit
                found.append(int(entry.name))
    return found
