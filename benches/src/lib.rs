//! Benchmarks and the `csi-bench` load generator (not built yet).
