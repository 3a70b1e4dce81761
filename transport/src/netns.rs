//! Network namespaces and veth pairs for tests and benchmarks (in progress).
