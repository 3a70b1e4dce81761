//! rocectl mr layer.
