"""The coordinator: the ``vesper`` command line, which drives runs and reads budgets."""
