-- Notifications per service by name: gold joined with the mirror of the source's
-- public.services table (capture it in LAKECDC_TABLES; docs/silver.md, "Mirrors").
-- gold keeps ids as text; the mirror keeps the uuid as text too.
SELECT s.name                                                            AS service,
       SUM(g.count)                                                      AS notifications,
       SUM(CASE WHEN g.notification_status = 'delivered' THEN g.count ELSE 0 END)
                                                                         AS delivered,
       MAX(s._lakecdc_commit_ts)                                         AS name_changed_at
FROM gold_service_stats g
JOIN silver_public_services s ON s.id = g.service_id
GROUP BY s.name
HAVING SUM(g.count) <> 0
ORDER BY notifications DESC, service
