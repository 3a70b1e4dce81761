//! rocectl conformance layer.
