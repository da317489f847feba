"""Maintenance, the pipeline's own job: which tables each writer keeps small (``plan``), the
writers' hooks that do it between their batches (``schedule``), and ``lakecdc maintain``
(``once``)."""
