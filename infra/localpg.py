"""A throw-away local PostgreSQL cluster with wal2json, for tests, CI and the demo.

Contract:
- ``LocalPostgres.start()`` runs ``initdb`` into a fresh directory, configures
  ``wal_level=logical`` on a free loopback port, starts the server and checks that the server
  it reaches is the one it started (``data_directory`` matches) before returning.
- ``stop()`` stops only that server; ``crash()`` stops it with ``-m immediate`` (a simulated
  crash: no shutdown checkpoint) so tests can watch slots go backwards.
- ``initdb`` and ``pg_ctl`` refuse to run as root, so as root they run through
  ``runuser -u postgres``; the data directory is then owned by ``postgres``.
- No local user can borrow the cluster while it runs: TCP on 127.0.0.1 asks for a
  password (scram-sha-256; the superuser's is random, kept in ``base_dir/password``, mode
  0600, and in the DSNs ``dsn()`` returns - lakecdc redacts it from every log line), and the
  Unix socket lives in ``base_dir``, mode 0700, owned by ``postgres``: only that user and
  root reach it. ``dsn(user=...)`` for any other role goes through the socket (trust).

Usage from a shell: ``python -m infra.localpg start DIR`` prints the DSN;
``python -m infra.localpg stop DIR``.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PG_VERSION = "15"
SERVER_SETTINGS = {
    "wal_level": "logical",
    "max_replication_slots": "32",
    "max_wal_senders": "16",
    "listen_addresses": "'127.0.0.1'",
    "fsync": "on",
    "synchronous_commit": "on",
    "shared_buffers": "128MB",
    "work_mem": "16MB",
    "max_connections": "60",
    "log_min_messages": "warning",
    "logging_collector": "off",
}


def bin_dir() -> Path:
    """Directory holding initdb/pg_ctl of the Debian ``postgresql-15`` package."""
    configured = os.environ.get("LAKECDC_PG_BIN")
    if configured:
        return Path(configured)
    return Path(f"/usr/lib/postgresql/{PG_VERSION}/bin")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_postgres(cmd: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *cmd]
    return cmd


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    result = subprocess.run(_as_postgres(cmd), capture_output=True, text=True, **kw)
    if result.returncode != 0:
        raise RuntimeError(f"{Path(cmd[0]).name} failed: {result.stderr.strip()[-500:]} "
                           "(as root, every parent directory must be traversable by the "
                           "postgres user)")
    return result


@dataclass
class LocalPostgres:
    """One throw-away cluster in ``base_dir`` (created if missing)."""

    base_dir: Path
    port: int = 0
    extra_settings: dict[str, str] | None = None

    def __post_init__(self) -> None:
        self.base_dir = Path(self.base_dir).resolve()
        if not self.port:
            self.port = free_port()

    @property
    def data_dir(self) -> Path:
        return self.base_dir / "data"

    @property
    def log_file(self) -> Path:
        return self.base_dir / "server.log"

    @property
    def password(self) -> str:
        """The superuser's password (TCP), made on the first start."""
        path = self.base_dir / "password"
        if not path.exists():
            self.base_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(24))
        return path.read_text().strip()

    def dsn(self, dbname: str = "postgres", user: str = "postgres") -> str:
        if user == "postgres":
            return f"postgresql://postgres:{self.password}@127.0.0.1:{self.port}/{dbname}"
        return f"postgresql://{user}@/{dbname}?host={self.base_dir}&port={self.port}"

    def start(self) -> "LocalPostgres":
        self.base_dir.mkdir(parents=True, exist_ok=True)
        password = self.password
        if os.geteuid() == 0:
            shutil.chown(self.base_dir, "postgres", "postgres")
        self.base_dir.chmod(0o700)
        if not (self.data_dir / "PG_VERSION").exists():
            pwfile = self.base_dir / "initdb-password"
            pwfile.write_text(password + "\n")
            if os.geteuid() == 0:
                shutil.chown(pwfile, "postgres", "postgres")
            try:
                _run([str(bin_dir() / "initdb"), "-D", str(self.data_dir), "-U", "postgres",
                      "--auth-local=trust", "--auth-host=scram-sha-256",
                      f"--pwfile={pwfile}", "--encoding=UTF8", "--locale=C.UTF-8",
                      "--no-sync"])
            finally:
                pwfile.unlink()
        self._write_settings()
        self._pg_ctl("start", "-w", "-t", "60", "-l", str(self.log_file))
        self._check_is_ours()
        return self

    def _write_settings(self) -> None:
        settings = {**SERVER_SETTINGS, "port": str(self.port),
                    "unix_socket_directories": f"'{self.base_dir}'",
                    **(self.extra_settings or {})}
        conf = "".join(f"{k} = {v}\n" for k, v in settings.items())
        path = self.data_dir / "lakecdc.conf"
        # Written through runuser so the file belongs to the cluster's owner.
        subprocess.run(_as_postgres(["tee", str(path)]), input=conf, check=True,
                       capture_output=True, text=True)
        main_conf = self.data_dir / "postgresql.conf"
        if "include_if_exists = 'lakecdc.conf'" not in main_conf.read_text():
            subprocess.run(_as_postgres(["tee", "-a", str(main_conf)]),
                           input="\ninclude_if_exists = 'lakecdc.conf'\n", check=True,
                           capture_output=True, text=True)

    def _pg_ctl(self, *args: str) -> None:
        _run([str(bin_dir() / "pg_ctl"), "-D", str(self.data_dir), *args])

    def _check_is_ours(self) -> None:
        import psycopg

        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(self.dsn(), connect_timeout=5) as conn:
                    reached = conn.execute("SHOW data_directory").fetchone()[0]
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        if Path(reached).resolve() != self.data_dir:
            raise RuntimeError(f"port {self.port} answers from {reached}, not our {self.data_dir}")

    def stop(self) -> None:
        if (self.data_dir / "postmaster.pid").exists():
            self._pg_ctl("stop", "-w", "-m", "fast")

    def crash(self) -> None:
        """Stop without a shutdown checkpoint, as a power cut would."""
        self._pg_ctl("stop", "-w", "-m", "immediate")

    def restart(self) -> None:
        self._pg_ctl("start", "-w", "-t", "60", "-l", str(self.log_file))
        self._check_is_ours()

    def base_backup(self, base_dir: Path, standby: bool = False) -> "LocalPostgres":
        """A physical copy of this cluster (``pg_basebackup``), not started. ``standby``:
        it follows this server by streaming replication once started (``promote`` it to
        simulate a failover); otherwise it starts as a restored copy of this moment.
        The backup starts from an immediate checkpoint: the default spread one paces its
        writes over checkpoint_timeout, about 100 s of waiting here (2 cores, loaded)."""
        copy = LocalPostgres(base_dir)
        copy.base_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(self.base_dir / "password", copy.base_dir / "password")  # same cluster
        if os.geteuid() == 0:
            shutil.chown(copy.base_dir, "postgres", "postgres")
        copy.base_dir.chmod(0o700)
        _run([str(bin_dir() / "pg_basebackup"), "-D", str(copy.data_dir),
              "-h", str(self.base_dir), "-p", str(self.port), "-U", "postgres",
              "-X", "stream", "--no-sync", "--checkpoint", "fast",
              *(["-R"] if standby else [])])
        return copy

    def promote(self) -> None:
        """End recovery of a standby: it becomes a primary on a new timeline."""
        self._pg_ctl("promote", "-w", "-t", "60")

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.base_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.localpg",
                                     description="Throw-away local Postgres with wal2json.")
    parser.add_argument("action", choices=["start", "stop", "destroy"])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    port_file = args.dir / "port"
    port = args.port or (int(port_file.read_text()) if port_file.exists() else 0)
    pg = LocalPostgres(args.dir, port=port)
    if args.action == "start":
        pg.start()
        port_file.write_text(str(pg.port))
        print(pg.dsn())
    elif args.action == "stop":
        pg.stop()
    else:
        pg.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
