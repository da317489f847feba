-- Notifications per service, type and status: the dashboard's main table.
SELECT service_id,
       notification_type,
       notification_status,
       SUM(count) AS notifications
FROM gold_service_stats
GROUP BY service_id, notification_type, notification_status
HAVING SUM(count) <> 0
ORDER BY service_id, notification_type, notifications DESC, notification_status
