"""The development lab: benchmarks, soak, profiler, mutations, preflight, training the demo models (not installed)."""
