//! The in-process inboxes between the engines of one device ([`crate::DeviceConfig::engines`]).
//!
//! The kernel steers each datagram to the engine that owns its destination QP
//! ([`crate::datapath::shard`]), but NAPI GRO (a NIC's, a veth's with GRO on) merges one
//! flow's datagrams by ports before the steering program runs, and the program sees only the
//! first: the merged buffer goes to the first datagram's owner. So every engine checks the
//! DestQP of each datagram it receives ([`Route::owner`]) and hands another engine's on
//! ([`Route::hand_on`]): copied into that engine's inbox, a buffer behind a leaf mutex, and
//! that engine's thread is woken. The owner drains its inbox at the start of each pass and
//! handles those datagrams as if it had received them. Nothing is dropped for being on the
//! wrong engine; only a full inbox ([`INBOX_MAX_BYTES`], an owner that stopped draining)
//! drops, counted in the owner's `rx_drop_kernel` like a full socket buffer.
//!
//! The inbox buffers keep their capacity: the owner swaps the full buffer with its empty
//! spare, so once warm, handing on allocates nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::datapath::RxMeta;
use crate::sys::lock;

/// The most bytes an inbox holds before it drops (an owner that does not drain).
pub(crate) const INBOX_MAX_BYTES: usize = 16 << 20;

/// Datagrams handed to one engine by the others.
#[derive(Debug, Default)]
pub(crate) struct InboxQueue {
    /// The datagrams' bytes, back to back.
    pub(crate) bytes: Vec<u8>,
    /// Each datagram: its metadata (`len` is its length) and where its bytes start.
    pub(crate) items: Vec<(RxMeta, usize)>,
}

impl InboxQueue {
    pub(crate) fn clear(&mut self) {
        self.bytes.clear();
        self.items.clear();
    }
}

/// One engine's inbox and how to wake its thread.
#[derive(Debug)]
pub(crate) struct Inbox {
    queue: Mutex<InboxQueue>,
    /// The engine thread's waker (`None` with manual progress).
    waker: Option<Arc<mio::Waker>>,
    /// Datagrams dropped because the inbox was full (folded into the owner's counters).
    dropped: AtomicU64,
}

impl Inbox {
    /// An inbox whose owner sleeps on `waker`.
    pub(crate) fn new(waker: Option<Arc<mio::Waker>>) -> Self {
        Self {
            queue: Mutex::new(InboxQueue::default()),
            waker,
            dropped: AtomicU64::new(0),
        }
    }

    /// Swaps the waiting datagrams into `spare` (which must be empty); returns whether any.
    pub(crate) fn take(&self, spare: &mut InboxQueue) -> bool {
        let mut q = lock(&self.queue);
        if q.items.is_empty() {
            return false;
        }
        std::mem::swap(&mut *q, spare);
        true
    }

    /// Datagrams dropped since the last call.
    pub(crate) fn take_dropped(&self) -> u64 {
        self.dropped.swap(0, Ordering::Relaxed)
    }
}

/// Where an engine sends the datagrams of other engines' QPs.
#[derive(Clone, Debug)]
pub(crate) struct Route {
    /// This engine's index.
    pub(crate) me: usize,
    /// Every engine's inbox, by index.
    pub(crate) all: Arc<[Inbox]>,
}

impl Route {
    /// The engine that owns `payload`'s destination QP, when it is another one. A datagram
    /// too short to hold a DestQP stays (its receiver counts it malformed).
    pub(crate) fn owner(&self, payload: &[u8]) -> Option<usize> {
        let q = payload.get(5..8)?;
        let qpn = u32::from_be_bytes([0, q[0], q[1], q[2]]);
        let owner = (qpn as usize) % self.all.len();
        (owner != self.me).then_some(owner)
    }

    /// Copies one datagram into engine `to`'s inbox; returns false when it was full (the
    /// datagram is dropped and counted there).
    pub(crate) fn hand_on(&self, to: usize, meta: &RxMeta, payload: &[u8]) -> bool {
        let inbox = &self.all[to];
        let mut q = lock(&inbox.queue);
        if q.bytes.len() + payload.len() > INBOX_MAX_BYTES {
            inbox.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let start = q.bytes.len();
        q.bytes.extend_from_slice(payload);
        let meta = RxMeta {
            len: payload.len(),
            stride: payload.len(),
            ..*meta
        };
        q.items.push((meta, start));
        true
    }

    /// Wakes engine `to`'s thread (after [`Self::hand_on`]).
    pub(crate) fn wake(&self, to: usize) {
        if let Some(w) = &self.all[to].waker {
            let _ = w.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(me: usize, n: usize) -> Route {
        Route {
            me,
            all: (0..n).map(|_| Inbox::new(None)).collect(),
        }
    }

    /// The owner is DestQP % n, read from BTH bytes 5..8; short datagrams stay.
    #[test]
    fn owner_is_destqp_mod_n() {
        let r = route(1, 3);
        let mut bth = [0u8; 12];
        bth[5..8].copy_from_slice(&[0x12, 0x34, 0x56]);
        assert_eq!(r.owner(&bth), Some(0x12_3456 % 3).filter(|&o| o != 1));
        bth[5..8].copy_from_slice(&[0, 0, 4]);
        assert_eq!(r.owner(&bth), None, "4 % 3 == 1: our own");
        bth[5..8].copy_from_slice(&[0, 0, 5]);
        assert_eq!(r.owner(&bth), Some(2));
        assert_eq!(r.owner(&bth[..7]), None);
    }

    /// Handed-on datagrams come out in order with their lengths; a full inbox drops and counts.
    #[test]
    fn hand_on_then_take_keeps_order_and_bounds() {
        let r = route(0, 2);
        let meta = RxMeta::empty();
        assert!(r.hand_on(1, &meta, b"first"));
        assert!(r.hand_on(1, &meta, b"second!"));
        let mut spare = InboxQueue::default();
        assert!(r.all[1].take(&mut spare));
        let got: Vec<&[u8]> = spare
            .items
            .iter()
            .map(|(m, s)| &spare.bytes[*s..*s + m.len])
            .collect();
        assert_eq!(got, vec![&b"first"[..], &b"second!"[..]]);
        spare.clear();
        assert!(!r.all[1].take(&mut spare));
        let big = vec![0u8; INBOX_MAX_BYTES];
        assert!(r.hand_on(1, &meta, &big));
        assert!(!r.hand_on(1, &meta, b"x"));
        assert_eq!(r.all[1].take_dropped(), 1);
        assert_eq!(r.all[1].take_dropped(), 0);
    }
}
