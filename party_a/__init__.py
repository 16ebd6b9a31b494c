"""Party A, the graph holder: graph store, sampler, encoder, extractors and the training loop."""
