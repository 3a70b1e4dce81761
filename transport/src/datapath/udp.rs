//! `udp` backend (in progress).
