//! rocectl wire layer.
