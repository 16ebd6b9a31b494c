"""Privacy math shared by the accountant and anyone auditing it: DpEvents, ε, ledger rules."""
