"""Ground truth of ``service_stats`` read straight from the source (DESIGN §2).

``count`` = notifications ever created, in their latest status, across ``notifications``
and ``notification_history``: a ``GROUP BY`` of the dims over both tables. Rows purged from
history since the baseline are not in it; callers that purge must add them back.
"""

from __future__ import annotations

import psycopg

Key = tuple[str, str, str, str]

TRUTH_SQL = """
SELECT service_id::text, template_id::text, notification_type::text, notification_status,
       count(*)
FROM (SELECT service_id, template_id, notification_type, notification_status
      FROM notifications
      UNION ALL
      SELECT service_id, template_id, notification_type, notification_status
      FROM notification_history) AS all_notifications
GROUP BY 1, 2, 3, 4"""


def source_counts(conn: psycopg.Connection) -> dict[Key, int]:
    return {tuple(r[:4]): r[4] for r in conn.execute(TRUTH_SQL)}
