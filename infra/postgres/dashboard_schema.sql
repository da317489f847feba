-- Dashboard tables lakecdc pushes gold into (`lakecdc setup`; idempotent).
--
-- service_stats: one row per (service, template, type, status) ever counted, with the
-- absolute count as of source commit source_commit_lsn / source_commit_ts (the gold
-- watermark of the push that last wrote the row). Rows at count 0 stay: the key existed.
-- The dims are text, as in gold, so this can live in any database (no enum types needed).
--
-- lakecdc_push_progress: per gold table, the gold version whose counts are in
-- service_stats. Written in the same transaction as service_stats, so the two never
-- disagree; a push of a version at or below it changes nothing.
--
-- Neither table is captured: when this is the source database, wal2json's add-tables keeps
-- the push's own writes out of the slot (RELIABILITY F20).
CREATE TABLE IF NOT EXISTS service_stats (
    service_id          text        NOT NULL,
    template_id         text        NOT NULL,
    notification_type   text        NOT NULL,
    notification_status text        NOT NULL,
    count               bigint      NOT NULL,
    source_commit_lsn   bigint,
    source_commit_ts    timestamptz,
    pushed_at           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (service_id, template_id, notification_type, notification_status)
);

CREATE TABLE IF NOT EXISTS lakecdc_push_progress (
    gold_table          text        PRIMARY KEY,   -- gold's path or URI
    gold_table_id       text,                      -- Delta table id: a new table = full push
    -- The newest gold version the counts equalled (pushed from it, or at its watermark
    -- exactly); -1 before the first push. Pushes ahead move the watermark below past it.
    gold_version        bigint      NOT NULL,
    source_commit_lsn   bigint,                    -- the counts are exact as of this commit
    source_commit_ts    timestamptz,
    pushed_at           timestamptz
);

-- lakecdc_layer_progress: per gold table and layer (bronze, silver, gold, dashboard, mirrors), the
-- source commit that layer holds everything up to, as of updated_at. Written by the push,
-- in the same transaction as service_stats (gold and dashboard: the pushed watermark;
-- bronze and silver: what the stream of the same `lakecdc run` has seen, when it runs in
-- that process; mirrors: every mirror holds every source transaction up to it, written by
-- the mirrors' query after each of its batches). A dashboard shows "exact as of
-- <source_commit_ts>" from the dashboard row and how far behind each layer is from the others.
CREATE TABLE IF NOT EXISTS lakecdc_layer_progress (
    gold_table          text        NOT NULL,
    layer               text        NOT NULL
        CHECK (layer IN ('bronze', 'silver', 'gold', 'dashboard', 'mirrors')),
    source_commit_lsn   bigint,
    source_commit_ts    timestamptz,
    updated_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (gold_table, layer)
);
