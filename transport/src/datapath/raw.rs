//! `raw` backend (in progress).
