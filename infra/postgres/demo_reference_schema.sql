-- The demo's reference tables beside notifications: captured and mirrored (silver/tables),
-- not counted. The summary and the picture take service names from the services mirror.
CREATE TABLE IF NOT EXISTS services (
    id          uuid PRIMARY KEY,
    name        text NOT NULL,
    active      boolean NOT NULL DEFAULT true,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS templates (
    id          uuid PRIMARY KEY,
    service_id  uuid NOT NULL,
    name        text NOT NULL,
    version     integer NOT NULL DEFAULT 1,
    content     text
);
