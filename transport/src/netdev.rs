//! Network interfaces: names, MACs, MTUs and addresses (in progress).
