"""Setting up: ``lakecdc setup`` (``prepare``: the source, the slot with its baselines, the
lakehouse and dashboard tables) and the captured set, changed while running (``tables``)."""
