//! rocectl qp layer.
