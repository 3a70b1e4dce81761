//! `sim` backend (in progress).
