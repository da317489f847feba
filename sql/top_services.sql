-- Top services by notifications created (every status, live and archived), with each
-- service's share of the total and how many of its notifications are finished.
-- Reads gold only: one row per (service, template, type, status) key, so it stays cheap
-- however many notifications there are.
WITH per_service AS (
    SELECT service_id,
           SUM(count)                                                    AS notifications,
           SUM(CASE WHEN notification_status IN ('delivered', 'permanent-failure',
                                                 'temporary-failure', 'technical-failure')
                    THEN count ELSE 0 END)                               AS finished,
           COUNT(DISTINCT template_id)                                   AS templates
    FROM gold_service_stats
    GROUP BY service_id
)
SELECT service_id,
       notifications,
       finished,
       templates,
       ROUND(100.0 * notifications / NULLIF(SUM(notifications) OVER (), 0), 2) AS share_pct
FROM per_service
WHERE notifications <> 0
ORDER BY notifications DESC, service_id
LIMIT 10
