"""The accountant service: write-ahead charging, the SQLite ledger and the REST status."""
