from pipelines.cli import entry

entry()
