//! rocectl transport layer.
