from pipelines.cli import process_entry

process_entry()
