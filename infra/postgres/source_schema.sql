-- Notify-like source schema used by the tests and the demo (a subset of GOV.UK Notify's
-- notifications / notification_history). The four dimension columns and id, key_type and
-- created_at are NOT NULL; every other column is nullable, as in Notify.
DO $$ BEGIN
    CREATE TYPE notification_type AS ENUM ('email', 'sms', 'letter');
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;

CREATE TABLE IF NOT EXISTS notifications (
    id                  uuid PRIMARY KEY,
    service_id          uuid NOT NULL,
    template_id         uuid NOT NULL,
    notification_type   notification_type NOT NULL,
    notification_status text NOT NULL,
    key_type            text NOT NULL,
    created_at          timestamptz NOT NULL,
    sent_at             timestamptz,
    updated_at          timestamptz,
    "to"                text,
    reference           text,
    billable_units      integer,
    personalisation     text,
    rate_multiplier     numeric
);

CREATE TABLE IF NOT EXISTS notification_history (LIKE notifications INCLUDING DEFAULTS);
DO $$ BEGIN
    ALTER TABLE notification_history ADD PRIMARY KEY (id);
EXCEPTION WHEN invalid_table_definition THEN NULL;
END $$;

-- Notify's workers pick notifications by status (the benchmark's and the demo's traffic
-- too): without this index each pick scans the whole table, and the cost of the traffic
-- grows with the table.
CREATE INDEX IF NOT EXISTS notifications_status ON notifications (notification_status);
