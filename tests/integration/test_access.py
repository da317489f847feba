"""Secrets and access (docs/security.md, "Threat model"): a malformed DSN never shows its
password, the metrics endpoint is local unless opened on purpose, a schema named after the
role cannot shadow lakecdc's tables, and names with a trailing newline are refused."""

from __future__ import annotations

import socket
import subprocess

import pytest

from core.config import Config
from core.errors import UserError
from pipelines.observe.metrics import parse_listen
from tests.tests_support import cli_env, error_line, run_cli

pytestmark = [pytest.mark.integration]


@pytest.mark.parametrize("dsn, secret", [
    ("postgresql://u:ab%!cd@db/x", "ab%!cd"),
    ("host=db dbname=x user=u password=my secret", "secret"),
])
def test_a_malformed_dsn_is_one_sentence_without_its_password(config, dsn, secret):
    for command in (["status"], ["ship", "--once"], ["setup"]):
        env = {**cli_env(config), "LAKECDC_SOURCE_DSN": dsn}
        result = run_cli(command, env)
        error_line(result, "not a valid connection string")
        assert secret not in result.stderr + result.stdout
        assert "!cd" not in result.stderr


def test_the_metrics_endpoint_binds_loopback_unless_a_host_is_given():
    assert parse_listen("9187") == ("127.0.0.1", 9187)
    assert parse_listen("0.0.0.0:9187") == ("0.0.0.0", 9187)
    assert parse_listen("[::1]:9187") == ("::1", 9187)


def test_the_metrics_server_listens_on_loopback_only_by_default():
    from prometheus_client import CollectorRegistry

    from pipelines.observe.metrics import serve

    with serve(CollectorRegistry(), "0") as port:
        listening = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True,
                                   check=True).stdout.split()
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    assert f"127.0.0.1:{port}" in listening
    assert not [a for a in listening if a.endswith(f":{port}") and not a.startswith("127.")]


@pytest.mark.parametrize("names", [{"slot": "lakecdc\n"},
                                   {"tables": ("public.notifications\n",
                                               "public.notification_history")},
                                   {"history_table": "public.notification_history\n"}])
def test_names_with_a_trailing_newline_are_refused(names):
    with pytest.raises(UserError):
        Config(**names).validate()


def test_a_schema_named_after_the_role_cannot_shadow_lakecdcs_tables(source_db, config):
    """The role owns a schema of its own name - first on the default search_path - holding
    decoy ``service_stats`` and ``lakecdc_push_progress``: setup and the push must still
    write the real ones in ``public``."""
    role = f"shadow_{source_db.name}"
    source_db.execute(f'CREATE ROLE "{role}" LOGIN SUPERUSER')
    try:
        source_db.execute(f'CREATE SCHEMA "{role}" AUTHORIZATION "{role}"')
        source_db.execute(f'CREATE TABLE "{role}".service_stats (x int)')
        source_db.execute(f'CREATE TABLE "{role}".lakecdc_push_progress (x int)')
        env = {**cli_env(config),
               "LAKECDC_SOURCE_DSN": source_db.cluster.dsn(source_db.name, user=role)}
        result = run_cli(["setup"], env)
        assert result.returncode == 0, result.stderr[-2000:]
        with source_db.connect() as conn:
            public = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public' "
                                  "AND tablename IN ('service_stats', 'lakecdc_push_progress')"
                                  ).fetchone()[0]
            decoy = conn.execute(f'SELECT count(*) FROM "{role}".service_stats').fetchone()[0]
        assert (public, decoy) == (2, 0)
    finally:
        source_db.execute(f'DROP OWNED BY "{role}" CASCADE')
        source_db.execute(f'DROP ROLE "{role}"')


def test_a_lock_squatted_by_another_role_does_not_stop_the_shipper_but_a_shipper_does(
        source_db, config):
    """Any role can take ``lakecdc.ship:<slot>`` (advisory locks have no privileges): the
    shipper passes over a holder of another role and names it; a session of the pipeline's
    own role holding it - another shipper - still refuses the start, naming it."""
    import psycopg

    from core.locks import acquire, ship_application, ship_lock_name, shipper_running
    from pipelines.setup.prepare import setup

    setup(config)
    role = f"squatter_{source_db.name}"
    source_db.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        with psycopg.connect(source_db.cluster.dsn(source_db.name, user=role),
                             autocommit=True) as squatter:
            squatter.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))",
                             [ship_lock_name(config.slot)])
            shipped = run_cli(["ship", "--once"], cli_env(config))
            assert shipped.returncode == 0, shipped.stderr[-2000:]
            assert f"role {role}" in shipped.stderr and "passed over" in shipped.stderr

            with source_db.connect() as probe:
                assert not shipper_running(probe, config.slot)      # only the squatter
                with source_db.connect() as rival:
                    # A shipper that passed the squatter over holds no lock, yet it runs:
                    # `backfill snapshot` must still see it (it waits for its chunks).
                    acquire(rival, ship_lock_name(config.slot), ship_application(config.slot),
                            "busy")
                    assert shipper_running(probe, config.slot)
                    refused = run_cli(["ship", "--once"], cli_env(config))
                    lines = [ln for ln in refused.stderr.splitlines()
                             if ln.startswith("lakecdc: error:")]
                    assert refused.returncode == 2 and len(lines) == 1, refused.stderr[-2000:]
                    assert "already running" in lines[0] and \
                        f"PID {rival.info.backend_pid}" in lines[0], lines[0]
    finally:
        source_db.execute(f'DROP ROLE "{role}"')


def test_the_local_test_and_demo_cluster_is_not_open_to_other_local_users(pg_cluster):
    """``infra/localpg.py``: TCP asks for the password, and the socket directory admits only
    the cluster's owner (and root)."""
    import os
    import stat

    import psycopg

    no_password = f"postgresql://postgres@127.0.0.1:{pg_cluster.port}/postgres"
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(no_password, connect_timeout=5).close()
    wrong = f"postgresql://postgres:wrong@127.0.0.1:{pg_cluster.port}/postgres"
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(wrong, connect_timeout=5).close()
    with psycopg.connect(pg_cluster.dsn(), connect_timeout=5) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    info = os.stat(pg_cluster.base_dir)
    assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid != 0
    assert stat.S_IMODE(os.stat(pg_cluster.base_dir / "password").st_mode) == 0o600
