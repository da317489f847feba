"""What shows where the pipeline is: ``lakecdc status`` (``status``), Prometheus metrics
(``metrics``, ``metrics_state``), the log lines (``logs``) and ``lakecdc sql`` (``query``)."""
