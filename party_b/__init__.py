"""Party B, the label holder: labels and split, decoders, loss, metrics and its service."""
