"""Party A's private representation extractors (PRE)."""
