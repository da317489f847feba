-- How current each layer is: the newest source commit it holds (LSN as a number), that
-- commit's time on the source, and its age now. Gold is exact as of its newest
-- last_commit_lsn; its source commit time comes from silver's row for that commit.
WITH gold AS (
    SELECT MAX(last_commit_lsn) AS commit_lsn, MAX(updated_at) AS updated_at
    FROM gold_service_stats
),
layers AS (
    SELECT 'bronze' AS layer, MAX(commit_lsn) AS commit_lsn, MAX(commit_ts) AS commit_ts,
           MAX(shipped_at) AS written_at
    FROM bronze_wal2json_changes
    UNION ALL
    SELECT 'silver', MAX(commit_lsn), MAX(commit_ts), MAX(shipped_at)
    FROM silver_changes
    UNION ALL
    SELECT 'gold', g.commit_lsn,
           (SELECT MAX(s.commit_ts) FROM silver_changes s WHERE s.commit_lsn = g.commit_lsn),
           g.updated_at
    FROM gold g
)
SELECT layer,
       commit_lsn,
       commit_ts                                                        AS source_commit_ts,
       written_at,
       ROUND(unix_micros(current_timestamp()) / 1e6 - unix_micros(commit_ts) / 1e6, 1)
                                                                        AS age_seconds
FROM layers
ORDER BY CASE layer WHEN 'bronze' THEN 1 WHEN 'silver' THEN 2 ELSE 3 END
