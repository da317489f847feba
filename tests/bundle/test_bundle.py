"""The Databricks asset bundle, validated offline: no workspace, no network, no CLI.

- the cloud is chosen once, by the one ``resources/clouds/<cloud>.yml`` databricks.yml
  includes; each cloud's file defines the two kinds of cluster (``job_cluster``,
  ``run_cluster``) and no job defines one of its own;
- with each cloud's file (AWS, Azure, GCP), every ``resources/*.job.yml`` job, its clusters
  resolved, loads with ``databricks-bundles`` (``Job.from_dict``: unknown or missing fields
  fail) and its clusters carry that cloud's attributes and no other's;
- every task is a ``python_wheel_task`` of this wheel whose entry point is in
  ``[project.scripts]`` and whose parameters parse as a real ``lakecdc`` command line;
- targets: ``dev`` is the default and ``mode: development``; ``prod`` is ``mode:
  production`` with a shared ``root_path``, ``run_as`` and permissions from variables;
- every ``${var.…}`` is defined, every variable is used, DSNs come only from secrets;
- every task runs on a job cluster in dedicated access mode (``SINGLE_USER``), never
  serverless: ``stream`` and ``mirrors`` refuse Spark Connect;
- the one continuous job runs ``lakecdc run``, the command the benchmark measures, and
  waits for setup instead of failing before it; schedules have a Quartz expression and a
  real time zone;
- the entry point ends a successful run without ``SystemExit`` (a wheel task would be
  marked failed) and a failing one with its exit code.
"""

from __future__ import annotations

import os
import re
import sys
import tomllib
import zoneinfo
from pathlib import Path

import click
import pytest
import yaml

from core.storage import BUNDLE_CLOUD_VARIABLES
from databricks.bundles.jobs import Job

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = yaml.safe_load((ROOT / "databricks.yml").read_text())
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
REFERENCE = re.compile(r"\$\{([^}]+)\}")


CLOUDS = ("aws", "azure", "gcp")
CLOUD_FILES = {c: ROOT / "resources" / "clouds" / f"{c}.yml" for c in CLOUDS}
CLOUD_VARIABLES = {c: yaml.safe_load(f.read_text())["variables"] for c, f in CLOUD_FILES.items()}
# The cloud attributes each cloud's clusters carry, and the storage variables of its own
# (core.storage.BUNDLE_CLOUD_VARIABLES) that reach delta-rs.
ATTRIBUTES = {"aws": "aws_attributes", "azure": "azure_attributes", "gcp": "gcp_attributes"}
STORAGE_VARIABLES = {"aws": {"AWS_REGION"},
                     "azure": {"AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY"},
                     "gcp": {"GOOGLE_SERVICE_ACCOUNT_KEY"}}


def _resource_files() -> list[Path]:
    return sorted(ROOT.glob(BUNDLE["include"][0]))


def _jobs() -> dict[str, dict]:
    jobs = {}
    for path in _resource_files():
        for name, job in yaml.safe_load(path.read_text())["resources"]["jobs"].items():
            assert name not in jobs, f"job {name} defined twice"
            jobs[name] = job
    return jobs


JOBS = _jobs()


def _variables(cloud: str) -> dict:
    return {**BUNDLE["variables"], **CLOUD_VARIABLES[cloud]}


def _resolved(value, cloud: str):
    """``value`` with each ``${var.X}`` that names a complex variable of ``cloud``'s file
    replaced by that variable's value (what the CLI does before it deploys)."""
    complex_ = {n: v["default"] for n, v in CLOUD_VARIABLES[cloud].items()
                if v.get("type") == "complex"}
    if isinstance(value, dict):
        return {k: _resolved(v, cloud) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolved(v, cloud) for v in value]
    match = REFERENCE.fullmatch(value) if isinstance(value, str) else None
    if match and match.group(1).startswith("var.") and match.group(1)[4:] in complex_:
        return complex_[match.group(1)[4:]]
    return value


def _strings(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, str):
        yield value


def test_the_bundle_has_a_name_an_include_and_the_wheel_artifact():
    assert BUNDLE["bundle"]["name"] == "lakecdc"
    assert BUNDLE["include"] == ["resources/*.job.yml", "resources/clouds/aws.yml"]
    assert [p.name for p in _resource_files()] == sorted(
        f"{name}.job.yml" for name in JOBS), "one <job>.job.yml per job, named after it"
    artifact = BUNDLE["artifacts"]["lakecdc"]
    assert artifact["type"] == "whl" and artifact["path"] == "."
    assert set(BUNDLE) <= {"bundle", "include", "artifacts", "variables", "targets"}


def test_the_jobs_users_need_are_all_there():
    assert set(JOBS) == {"lakecdc_setup", "lakecdc_run", "lakecdc_verify", "lakecdc_rebuild",
                         "lakecdc_backfill"}


@pytest.mark.parametrize("cloud", CLOUDS)
@pytest.mark.parametrize("name", sorted(JOBS))
def test_every_job_loads_with_databricks_bundles_on_every_cloud(name, cloud):
    resolved = _resolved(JOBS[name], cloud)
    job = Job.from_dict(resolved)
    assert job.name and job.tasks
    assert job.as_dict()["tasks"] == JOBS[name]["tasks"]
    for cluster in job.as_dict()["job_clusters"]:
        spec = cluster["new_cluster"]
        assert ATTRIBUTES[cloud] in spec, (name, cloud)
        assert not set(ATTRIBUTES.values()) - {ATTRIBUTES[cloud]} & set(spec), (name, cloud)


@pytest.mark.parametrize("cloud", CLOUDS)
def test_each_kind_of_cluster_is_defined_once_per_cloud(cloud):
    """Every job names one of the two kinds; only the cloud's file defines them, and the
    run cluster is the job cluster on a node of its own."""
    kinds = {c["new_cluster"] for j in JOBS.values() for c in j["job_clusters"]}
    assert kinds == {"${var.job_cluster}", "${var.run_cluster}"}
    variables = CLOUD_VARIABLES[cloud]
    job, run = variables["job_cluster"]["default"], variables["run_cluster"]["default"]
    assert variables["job_cluster"]["type"] == variables["run_cluster"]["type"] == "complex"
    assert {**job, "node_type_id": "${var.run_node_type_id}"} == run
    assert job["node_type_id"] == "${var.job_node_type_id}"
    clusters = JOBS["lakecdc_run"]["job_clusters"]
    assert [c["new_cluster"] for c in clusters] == ["${var.run_cluster}"]
    for spec in (job, run):
        assert spec["num_workers"] == 0
        assert spec["spark_conf"]["spark.databricks.cluster.profile"] == "singleNode"
    text = "\n".join(p.read_text() for p in _resource_files())
    assert not re.search(r"node_type_id|_attributes|spark_env_vars", text)


def _task_commands():
    for job_name, job in JOBS.items():
        for task in job["tasks"]:
            yield job_name, task


def test_every_task_is_a_wheel_task_with_a_real_entry_point_and_command():
    from pipelines.cli import cli

    scripts = PYPROJECT["project"]["scripts"]
    for job_name, task in _task_commands():
        where = f"{job_name}.{task['task_key']}"
        wheel = task["python_wheel_task"]
        assert wheel["package_name"] == PYPROJECT["project"]["name"], where
        assert wheel["entry_point"] in scripts, where
        libraries = [{"whl": "../dist/*.whl"}]
        if wheel["parameters"][0] == "quality":     # the gates' extra: a wheel takes none
            libraries += [{"pypi": {"package": spec}} for spec in _extra("quality")
                          if spec.startswith("great-expectations")]
        assert task["libraries"] == libraries, where
        assert scripts[wheel["entry_point"]] == "pipelines.cli:entry"
        _parse(cli, list(wheel["parameters"]), where)


def _extra(name: str) -> list[str]:
    return PYPROJECT["project"]["optional-dependencies"][name]


def _parse(group: click.Group, args: list[str], where: str) -> None:
    """Parse ``args`` as ``lakecdc`` would, down to the leaf command, without running it."""
    command, rest = group, list(args)
    while isinstance(command, click.Group):
        assert rest and rest[0] in command.commands, f"{where}: no command in {args}"
        command, rest = command.commands[rest[0]], rest[1:]
    ctx = command.make_context(command.name, rest)      # unknown options raise here
    assert not ctx.args, f"{where}: unexpected arguments {ctx.args}"


def test_targets_and_modes():
    targets = BUNDLE["targets"]
    assert set(targets) == {"dev", "prod"}
    dev, prod = targets["dev"], targets["prod"]
    assert dev["mode"] == "development" and dev["default"] is True
    assert prod["mode"] == "production" and not prod.get("default")
    root = prod["workspace"]["root_path"]
    assert root.startswith("/Workspace/Users/${workspace.current_user.userName}/")
    assert "Shared" not in root and "${bundle.target}" in root
    assert prod["run_as"] == {"service_principal_name": "${var.prod_service_principal}"}
    assert prod["permissions"] == [{"group_name": "${var.operators_group}",
                                    "level": "CAN_MANAGE_RUN"}]
    # Each target its own secret scope: a dev deploy never reads prod's DSNs.
    assert "default" not in BUNDLE["variables"]["secret_scope"]
    scopes = {t: targets[t]["variables"]["secret_scope"] for t in ("dev", "prod")}
    assert scopes["dev"] != scopes["prod"], scopes


@pytest.mark.parametrize("cloud", CLOUDS)
def test_every_variable_reference_is_defined_and_every_variable_used(cloud):
    defined = set(_variables(cloud))
    files = [ROOT / "databricks.yml", *_resource_files(), CLOUD_FILES[cloud]]
    used = set()
    for text in (f.read_text() for f in files):
        for ref in REFERENCE.findall(text):
            root = ref.split(".")[0]
            assert root in {"var", "bundle", "workspace", "resources"}, f"unknown ${{{ref}}}"
            if root == "var":
                used.add(ref.split(".", 1)[1])
    assert used <= defined, f"undefined variables: {sorted(used - defined)}"
    assert defined <= used, f"variables nobody uses: {sorted(defined - used)}"
    for name, spec in _variables(cloud).items():
        assert spec.get("description"), f"variable {name} needs a description"
    assert not set(BUNDLE["variables"]) & set(CLOUD_VARIABLES[cloud])


SECRET = {"LAKECDC_SOURCE_DSN": "{{secrets/${var.secret_scope}/${var.source_dsn_key}}}",
          "LAKECDC_DASHBOARD_DSN": "{{secrets/${var.secret_scope}/${var.dashboard_dsn_key}}}"}


@pytest.mark.parametrize("cloud", CLOUDS)
def test_configuration_reaches_every_cluster_and_dsns_only_from_secrets(cloud):
    for kind in ("job_cluster", "run_cluster"):
        env = CLOUD_VARIABLES[cloud][kind]["default"]["spark_env_vars"]
        assert env["LAKECDC_LAKEHOUSE"] == "${var.lakehouse_root}", kind
        assert env["LAKECDC_SLOT"] == "${var.slot}", kind
        assert env["LAKECDC_CATALOG"] == "${var.catalog}", kind
        assert env["LAKECDC_SCHEMA"] == "${var.schema}", kind
        assert env["LAKECDC_WRITER"] == "${var.writer}", kind
        # The cloud's own storage variables (docs/storage.md), and no other cloud's.
        assert set(env) & set(BUNDLE_CLOUD_VARIABLES) == STORAGE_VARIABLES[cloud], kind
        assert {k: v for k, v in env.items() if k.endswith("_DSN")} == SECRET, kind
    for name, job in JOBS.items():
        keys = {c["job_cluster_key"] for c in job["job_clusters"]}
        assert {t["job_cluster_key"] for t in job["tasks"]} <= keys, name
    everything = [s for f in (BUNDLE, CLOUD_VARIABLES[cloud], *JOBS.values()) for s in _strings(f)]
    assert not [s for s in everything if "postgres" in s.lower() and "://" in s]


def test_every_task_runs_on_a_dedicated_job_cluster_not_serverless():
    """``stream``, ``mirrors`` and ``run`` refuse Spark Connect (standard access mode and
    serverless: ``core.spark.require_classic``), so every task names a job cluster (a task
    without one runs serverless) and every cluster asks for dedicated access mode."""
    for name, job in JOBS.items():
        assert "environments" not in job, name
        keys = {c["job_cluster_key"] for c in job["job_clusters"]}
        for task in job["tasks"]:
            assert task.get("job_cluster_key") in keys and "environment_key" not in task, \
                (name, task["task_key"])
    for cloud in CLOUDS:
        for kind in ("job_cluster", "run_cluster"):
            spec = CLOUD_VARIABLES[cloud][kind]["default"]
            assert spec["data_security_mode"] == "SINGLE_USER", (cloud, kind)


def test_the_continuous_job_is_run_as_measured_and_waits_for_setup():
    """The bundle deploys the topology the benchmark measures: one ``lakecdc run``, which
    on a fresh deployment waits for the setup job (one line) instead of failing and
    restarting until someone runs it."""
    continuous = {n for n, j in JOBS.items() if "continuous" in j}
    assert continuous == {"lakecdc_run"}
    job = JOBS["lakecdc_run"]
    assert job["max_concurrent_runs"] == 1
    assert job["continuous"] == {"pause_status": "UNPAUSED", "task_retry_mode": "ON_FAILURE"}
    [task] = job["tasks"]
    assert task["python_wheel_task"]["parameters"] == ["run", "--wait-for-input", "forever"]
    assert not task.get("depends_on")


def test_schedules_are_quartz_with_a_time_zone_and_gates_come_first():
    variables = BUNDLE["variables"]
    assert zoneinfo.ZoneInfo(variables["timezone_id"]["default"])
    scheduled = {n: j["schedule"] for n, j in JOBS.items() if "schedule" in j}
    assert set(scheduled) == {"lakecdc_verify", "lakecdc_rebuild", "lakecdc_backfill"}
    for name, schedule in scheduled.items():
        fields = schedule["quartz_cron_expression"].split()
        assert len(fields) in (6, 7) and "?" in fields, name
        assert schedule["timezone_id"] == "${var.timezone_id}", name
    order = {n: [(t["task_key"], [d["task_key"] for d in t.get("depends_on", [])])
                 for t in JOBS[n]["tasks"]] for n in ("lakecdc_verify", "lakecdc_rebuild")}
    assert order["lakecdc_verify"] == [("quality", []), ("verify", ["quality"])]
    assert order["lakecdc_rebuild"] == [("quality_silver", []),
                                        ("rebuild_gold", ["quality_silver"]),
                                        ("quality_gold", ["rebuild_gold"])]


def test_the_entry_point_ends_success_without_systemexit(monkeypatch, capsys):
    from pipelines.cli import entry

    monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "15.4")    # as in a wheel task
    monkeypatch.setattr(sys, "argv", ["lakecdc", "--help"])
    assert entry() is None                   # returns: a wheel task counts it a success
    assert "quality" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["lakecdc", "sql"])
    with pytest.raises(SystemExit) as failed:
        entry()
    assert failed.value.code == 2


@pytest.mark.parametrize("args, code", [(["--help"], 0), (["sql"], 2)])
def test_the_console_script_ends_its_process_without_the_interpreter_teardown(args, code):
    """Outside Databricks the process ends in ``entry`` (pyarrow's threads can abort the
    teardown of a process that read a Delta table): nothing registered to run at exit runs,
    and the exit code is the command's."""
    import subprocess

    script = ("import atexit, sys; atexit.register(print, 'torn down'); "
              f"sys.argv = ['lakecdc', *{args!r}]; "
              "from pipelines.cli import entry; entry(); print('returned')")
    env = {k: v for k, v in os.environ.items() if k != "DATABRICKS_RUNTIME_VERSION"}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == code, done.stderr[-2000:]
    assert "torn down" not in done.stdout and "returned" not in done.stdout, done.stdout[-2000:]


def test_transient_failures_are_retried_and_gates_are_not():
    retried = {t["task_key"] for j in JOBS.values() for t in j["tasks"]
               if t.get("max_retries", 0) >= 1 and t.get("min_retry_interval_millis", 0) > 0}
    assert {"setup", "verify", "rebuild_gold", "backfill_snapshot"} <= retried
    # Quality gates fail on data, not on luck: never retried.
    gates = {t["task_key"] for j in JOBS.values() for t in j["tasks"]
             if t["python_wheel_task"]["parameters"][0] == "quality"}
    assert gates and not gates & retried


def test_an_empty_cloud_variable_from_the_bundle_counts_as_unset():
    """A cloud's optional key left empty in the bundle (Azure's account key, GCP's service
    account key: the cluster's identity then) is dropped by the CLI before delta-rs can
    take an empty key."""
    from core.storage import drop_empty_cloud_variables

    environ = {"AZURE_STORAGE_ACCOUNT_KEY": "", "AZURE_STORAGE_ACCOUNT_NAME": "acct",
               "GOOGLE_SERVICE_ACCOUNT_KEY": "", "LAKECDC_SLOT": ""}
    assert drop_empty_cloud_variables(environ) == ["AZURE_STORAGE_ACCOUNT_KEY",
                                                   "GOOGLE_SERVICE_ACCOUNT_KEY"]
    assert environ == {"AZURE_STORAGE_ACCOUNT_NAME": "acct", "LAKECDC_SLOT": ""}


def test_the_catalog_variables_default_to_paths_only_and_name_a_schema_when_set():
    """Unset (the defaults, empty), no table is registered by name; set, they are the
    catalog and schema setup registers in (docs/databricks.md, "Unity Catalog")."""
    from core.config import Config

    variables = BUNDLE["variables"]
    defaults = {"LAKECDC_CATALOG": variables["catalog"]["default"],
                "LAKECDC_SCHEMA": variables["schema"]["default"]}
    assert not Config.load(env=defaults).registers
    named = Config.load(env={"LAKECDC_CATALOG": "main", "LAKECDC_SCHEMA": "lakecdc"})
    assert (named.catalog, named.catalog_schema) == ("main", "lakecdc")


def test_the_writer_variable_defaults_to_delta_rs_and_takes_spark():
    """Unset, the clusters' own credentials write through delta-rs; ``spark`` sends every
    read and write through Spark (docs/databricks.md, "Which workspace you have")."""
    from core.config import Config

    default = BUNDLE["variables"]["writer"]["default"]
    assert not Config.load(env={"LAKECDC_WRITER": default}).spark_writes
    assert Config.load(env={"LAKECDC_WRITER": "spark"}).spark_writes
