//! # roce-transport: the software RoCEv2 NIC
//!
//! Datapath backends ([`datapath`]), the engine that drives queue pairs over them, and the
//! verbs-like public API.

pub mod datapath;
pub mod netdev;
pub mod netns;
