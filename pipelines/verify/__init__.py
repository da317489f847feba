"""Checking: gold and the dashboard against the source at one LSN (``reconcile``, its verdict
in ``report``), each mirror against its source table (``mirrors``), and the Great
Expectations gates (``quality``)."""
