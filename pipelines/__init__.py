"""How lakecdc runs: configuration, the Spark factory, the CLI and one entry point per job."""
