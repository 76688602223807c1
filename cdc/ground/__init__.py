"""The ground every layer stands on: errors and exit codes, the pipeline file model,
table names and quoting, secrets redaction, LSN helpers and fix-line commands.

Modules here import nothing from the rest of the project (the layers contract in
setup.cfg checks it), so capture, snapshot, sinks and the apply job can all use them.
"""
