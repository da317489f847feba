import pytest

from core.config import GUARDS, Config
from core.errors import UserError, redact
from core.switches import NONE, Switches
from core.lsn import Lsn, fmt


@pytest.mark.parametrize("text,value", [
    ("0/0", 0),
    ("0/1536B18", 0x1536B18),
    ("16/3002D50", (0x16 << 32) | 0x3002D50),
    ("FFFFFFFF/FFFFFFFF", 2**64 - 1),
])
def test_lsn_parses_and_formats_round_trip(text, value):
    assert int(Lsn.parse(text)) == value
    assert str(Lsn(value)) == text


@pytest.mark.parametrize("bad", ["", "16", "/1", "1/", "x/1", "1/2/3", "123456789/0"])
def test_lsn_rejects_malformed_text(bad):
    with pytest.raises(ValueError):
        Lsn.parse(bad)


def test_lsn_orders_as_unsigned_positions():
    values = ["1/0", "0/FFFFFFFF", "0/10", "FFFFFFFF/0", "0/9"]
    assert [str(v) for v in sorted(map(Lsn.parse, values))] == \
        ["0/9", "0/10", "0/FFFFFFFF", "1/0", "FFFFFFFF/0"]
    assert Lsn.parse("0/A") == Lsn(10)
    assert fmt(None) == "-"


def test_flags_override_environment_which_overrides_defaults():
    env = {"LAKECDC_SOURCE_DSN": "postgresql://a@h/db", "LAKECDC_SLOT": "from_env",
           "LAKECDC_LAKEHOUSE": "/lh"}
    cfg = Config.load(env=env, slot="from_flag", lakehouse=None)
    assert (cfg.slot, cfg.lakehouse, cfg.source_dsn) == ("from_flag", "/lh", "postgresql://a@h/db")
    assert cfg.dashboard == "postgresql://a@h/db"          # defaults to the source
    assert Config.load(env={}).slot == "lakecdc"
    assert Config.load(env={}).bronze_path == "./lakehouse/bronze/wal2json_changes"


def test_captured_tables_default_to_the_counted_tables():
    assert Config.load(env={}).tables == ("public.notifications", "public.notification_history")
    moved = Config.load(env={"LAKECDC_NOTIFICATIONS_TABLE": "notify.notifications",
                             "LAKECDC_HISTORY_TABLE": "notify.notification_history"})
    assert moved.tables == ("notify.notifications", "notify.notification_history")
    with pytest.raises(UserError, match="not among the captured tables"):
        Config.load(env={"LAKECDC_NOTIFICATIONS_TABLE": "notify.notifications",
                         "LAKECDC_TABLES": "public.notifications,public.notification_history"})


def test_mirrored_tables_are_all_none_or_a_list_of_captured_tables():
    tables = "public.notifications,public.notification_history,public.services"
    assert Config.load(env={"LAKECDC_TABLES": tables}).mirrored == tuple(tables.split(","))
    assert Config.load(env={"LAKECDC_TABLES": tables, "LAKECDC_MIRRORS": "all"}).mirrors is None
    assert Config.load(env={"LAKECDC_MIRRORS": "none"}).mirrored == ()
    assert Config.load(env={"LAKECDC_TABLES": tables, "LAKECDC_MIRRORS": " public.services"}
                       ).mirrored == ("public.services",)
    with pytest.raises(UserError, match="public.services .LAKECDC_MIRRORS. are not captured"):
        Config.load(env={"LAKECDC_MIRRORS": "public.services"})


def test_the_writer_is_delta_rs_unless_spark_is_asked_for():
    assert Config.load(env={}).writer == "delta-rs"
    assert not Config.load(env={}).spark_writes
    assert Config.load(env={"LAKECDC_WRITER": " spark "}).spark_writes


def test_the_mirrors_interval_is_seconds_and_defaults_to_1():
    assert Config.load(env={}).mirror_interval_s == 1
    assert Config.load(env={"LAKECDC_MIRROR_INTERVAL": "2.5"}).mirror_interval_s == 2.5


def test_the_mirrors_merge_time_for_a_tail_is_seconds_and_defaults_to_1():
    assert Config.load(env={}).mirror_merge_s == 1
    assert Config.load(env={"LAKECDC_MIRROR_MERGE_S": "0"}).mirror_merge_s == 0


@pytest.mark.parametrize("master", ["local[2]", "local[*]", "local", "spark://10.0.0.5:7077",
                                    "spark://a.example:7077,b.example:7077"])
def test_the_spark_master_is_local_or_a_standalone_cluster(master):
    assert Config.load(env={}).spark_master == "local[2]"
    assert Config.load(env={"LAKECDC_SPARK_MASTER": master}).spark_master == master


def test_gold_fold_share_is_a_share_and_defaults_to_a_tenth():
    assert Config.load(env={}).gold_fold_share == 0.1
    assert Config.load(env={"LAKECDC_GOLD_FOLD_SHARE": "1"}).gold_fold_share == 1.0
    assert Config.load(env={"LAKECDC_GOLD_FOLD_SHARE": "0"}).gold_fold_share == 0.0


def test_the_stream_s_trigger_defaults_to_2_seconds():
    assert Config.load(env={}).stream_trigger_s == 2.0
    assert Config.load(env={"LAKECDC_TRIGGER_INTERVAL": "0.5"}).stream_trigger_s == 0.5


@pytest.mark.parametrize("text,kept", [
    ("", {"silver": 1440, "gold": 1440, "mirrors": 1440}),
    ("7d", {"silver": 10080, "gold": 10080, "mirrors": 10080}),
    ("48", {"silver": 2880, "gold": 2880, "mirrors": 2880}),
    ("24h,mirrors=90m", {"silver": 1440, "gold": 1440, "mirrors": 90}),
    ("silver=1m, gold = 2h", {"silver": 1, "gold": 120, "mirrors": 1440}),
])
def test_the_tables_others_read_keep_a_day_unless_a_group_says_otherwise(text, kept):
    config = Config.load(env={"LAKECDC_READER_RETENTION": text})
    assert {g: config.kept_minutes(g) for g in kept} == kept
    assert config.log_retention_minutes == 10           # lakecdc's own tables


@pytest.mark.parametrize("env,fragment", [
    ({"LAKECDC_READER_RETENTION": "0h"}, "LAKECDC_READER_RETENTION='0h'.*1 or more"),
    ({"LAKECDC_READER_RETENTION": "1w"}, "LAKECDC_READER_RETENTION.*units m, h, d"),
    ({"LAKECDC_READER_RETENTION": "bronze=1h"}, "groups silver, gold, mirrors"),
    ({"LAKECDC_READER_RETENTION": "24h,"}, "LAKECDC_READER_RETENTION"),
    ({"LAKECDC_SLOT": "Bad-Name"}, "slot name"),
    ({"LAKECDC_GOLD_FOLD_SHARE": "1.5"}, "LAKECDC_GOLD_FOLD_SHARE.*from 0 to 1"),
    ({"LAKECDC_GOLD_FOLD_SHARE": "often"}, "LAKECDC_GOLD_FOLD_SHARE.*from 0 to 1"),
    ({"LAKECDC_TRIGGER_INTERVAL": "0"}, "LAKECDC_TRIGGER_INTERVAL.*positive"),
    ({"LAKECDC_TABLES": "notifications"}, "schema.table"),
    ({"LAKECDC_UNSAFE_DISABLE_GUARDS": "nonsense"}, "unknown guard"),
    ({"LAKECDC_MIRROR_INTERVAL": "0"}, "LAKECDC_MIRROR_INTERVAL"),
    ({"LAKECDC_MIRROR_INTERVAL": "soon"}, "LAKECDC_MIRROR_INTERVAL"),
    ({"LAKECDC_MIRROR_MERGE_S": "-1"}, "LAKECDC_MIRROR_MERGE_S"),
    ({"LAKECDC_MIRROR_MERGE_S": "big"}, "LAKECDC_MIRROR_MERGE_S"),
    ({"LAKECDC_SPARK_MASTER": "yarn"}, "LAKECDC_SPARK_MASTER.*spark://host:port"),
    ({"LAKECDC_SPARK_MASTER": "spark://host"}, "LAKECDC_SPARK_MASTER"),
    ({"LAKECDC_WRITER": "polars"}, "LAKECDC_WRITER='polars'.*delta-rs.*spark"),
])
def test_invalid_configuration_is_a_user_error(env, fragment):
    with pytest.raises(UserError, match=fragment):
        Config.load(env=env)


def test_a_negative_poll_interval_is_a_user_error():
    with pytest.raises(UserError, match="--poll-interval must be a number of seconds >= 0"):
        Config.load(env={}, poll_interval_s=-0.1)
    assert Config.load(env={}, poll_interval_s=0).poll_interval_s == 0


def test_missing_source_dsn_says_what_to_set():
    with pytest.raises(UserError, match="LAKECDC_SOURCE_DSN"):
        Config.load(env={}).require_source()


@pytest.mark.parametrize("text,expected", [
    ("postgresql://user:s3cret@db:5432/x", "postgresql://user:***@db:5432/x"),
    ("host=db password=s3cret user=u", "host=db password=*** user=u"),
    ("host=db password='s 3cret' user=u", "host=db password=*** user=u"),
    ("postgresql://user@db/x", "postgresql://user@db/x"),
])
def test_redact_hides_passwords_in_any_dsn_form(text, expected):
    assert redact(text) == expected
    assert "s3cret" not in redact(f"could not connect: {text}")


def test_fault_point_fires_only_on_its_nth_pass(monkeypatch):
    calls = []
    monkeypatch.setattr("os._exit", lambda code: calls.append(code))
    switches = Switches("after_peek:3,other:1")
    for _ in range(5):
        switches.hit("after_peek")
        switches.hit("unlisted")
    assert calls == [137]


def test_switches_from_the_configuration_and_the_default_that_does_nothing(monkeypatch):
    calls = []
    monkeypatch.setattr("os._exit", lambda code: calls.append(code))
    config = Config.load(env={"LAKECDC_FAULT": "after_peek:1",
                              "LAKECDC_UNSAFE_DISABLE_GUARDS": "gold_txn"})
    switches = Switches.from_config(config)
    assert not switches.on("gold_txn") and switches.on("silver_txn")
    NONE.hit("after_peek")
    assert calls == [] and all(NONE.on(g) for g in GUARDS)
    switches.hit("after_peek")
    assert calls == [137]
