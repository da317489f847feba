-- Least-privilege roles for lakecdc. Run once as a superuser (or a role with CREATEROLE
-- that owns the tables), connected to the SOURCE database; run the dashboard part in the
-- dashboard database if that is another one. Idempotent. Set passwords separately
-- (ALTER ROLE ... PASSWORD '...'), never in this file.
--
--   lakecdc_replicator   what LAKECDC_SOURCE_DSN connects as: the shipper, setup, verify,
--                        rebuilds and backfills. REPLICATION (logical slots: create, peek,
--                        advance; temporary slots with exported snapshots) and SELECT on
--                        the two captured tables, for the baseline and verify counts and
--                        the snapshot backfill. Nothing else: it cannot read other tables
--                        or write anything.
--   lakecdc_dashboard    what LAKECDC_DASHBOARD_DSN connects as: the push. SELECT, INSERT,
--                        UPDATE, DELETE on service_stats, lakecdc_push_progress and
--                        lakecdc_layer_progress only (and the TEMP privilege PUBLIC has by
--                        default, for COPY staging).
--   lakecdc_dashboard_reader   dashboards: SELECT on service_stats and
--                        lakecdc_layer_progress (how fresh each layer is).
--
-- Before this file, as the tables' owners: the dashboard tables
-- (psql -f infra/postgres/dashboard_schema.sql in the dashboard database), and the replica
-- identity of the captured tables (`lakecdc setup` once as the owner, or the statements in
-- docs/security.md). After it, everything runs as these roles.

DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'lakecdc_replicator') THEN
        CREATE ROLE lakecdc_replicator LOGIN REPLICATION;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'lakecdc_dashboard') THEN
        CREATE ROLE lakecdc_dashboard LOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'lakecdc_dashboard_reader') THEN
        CREATE ROLE lakecdc_dashboard_reader LOGIN;
    END IF;
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO lakecdc_replicator, lakecdc_dashboard, '
                   'lakecdc_dashboard_reader', current_database());
END
$$;

-- Source: the captured tables, read-only.
GRANT USAGE ON SCHEMA public TO lakecdc_replicator;
GRANT SELECT ON public.notifications, public.notification_history TO lakecdc_replicator;

-- Dashboard: the three tables lakecdc writes (created beforehand by their owner from
-- infra/postgres/dashboard_schema.sql).
GRANT USAGE ON SCHEMA public TO lakecdc_dashboard, lakecdc_dashboard_reader;
GRANT SELECT, INSERT, UPDATE, DELETE ON public.service_stats, public.lakecdc_push_progress,
    public.lakecdc_layer_progress TO lakecdc_dashboard;
GRANT SELECT ON public.service_stats, public.lakecdc_layer_progress
    TO lakecdc_dashboard_reader;

-- Source: logical messages. lakecdc reads messages under its own prefixes (the snapshot
-- backfill's watermarks, verify's markers) and writes heartbeats; by default every role
-- may call pg_logical_emit_message, and so write under those prefixes too. lakecdc skips
-- what is not its own (docs/security.md, "Logical messages"), but each such message still
-- costs WAL and decoding: only lakecdc's role (and superusers) should emit them. Both
-- overloads; in the source database, the only one whose messages the slot decodes.
REVOKE EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean, text, bytea) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean, text, text)
    TO lakecdc_replicator;
GRANT EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(boolean, text, bytea)
    TO lakecdc_replicator;
