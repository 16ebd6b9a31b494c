"""What both parties share: wire codec, configuration, dataset files and splits, privacy math."""
