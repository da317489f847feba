-- Failure rate per service and notification type, over finished notifications only
-- (delivered or failed; still created/sending are not counted either way).
WITH finished AS (
    SELECT service_id,
           notification_type,
           SUM(CASE WHEN notification_status = 'delivered' THEN count ELSE 0 END)
               AS delivered,
           SUM(CASE WHEN notification_status = 'permanent-failure' THEN count ELSE 0 END)
               AS permanent_failures,
           SUM(CASE WHEN notification_status = 'temporary-failure' THEN count ELSE 0 END)
               AS temporary_failures,
           SUM(CASE WHEN notification_status = 'technical-failure' THEN count ELSE 0 END)
               AS technical_failures
    FROM gold_service_stats
    GROUP BY service_id, notification_type
)
SELECT service_id,
       notification_type,
       delivered,
       permanent_failures + temporary_failures + technical_failures AS failed,
       ROUND(100.0 * (permanent_failures + temporary_failures + technical_failures)
             / NULLIF(delivered + permanent_failures + temporary_failures
                      + technical_failures, 0), 2)                  AS failure_rate_pct,
       permanent_failures,
       temporary_failures,
       technical_failures
FROM finished
WHERE delivered + permanent_failures + temporary_failures + technical_failures > 0
ORDER BY failure_rate_pct DESC, service_id, notification_type
