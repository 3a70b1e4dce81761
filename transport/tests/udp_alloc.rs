//! The `udp` backend allocates nothing per send or receive: a counting global allocator
//! watches 100 rounds of a 65-datagram GSO batch and its GRO receive, plus plain batches, on
//! this test's thread.

mod udp_support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::IoSliceMut;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use roce_transport::datapath::udp::UdpOptions;
use roce_transport::datapath::{Datapath, RxMeta};
use udp_support::{arena, bind, datagrams, private_net, DEADLINE};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above, i.e. from the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: as for `alloc` and `dealloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn send_and_recv_do_not_allocate() {
    let _net = private_net();
    // The counter counts.
    COUNTING.with(|c| c.set(true));
    drop(std::hint::black_box(Vec::<u8>::with_capacity(1)));
    COUNTING.with(|c| c.set(false));
    assert_eq!(ALLOCATIONS.swap(0, Ordering::Relaxed), 1);

    for opts in [
        UdpOptions::default(),
        UdpOptions {
            gso: false,
            gro: false,
            tos: 0x02,
            batch: 16,
            ..UdpOptions::default()
        },
    ] {
        let mut a = bind("127.0.0.1:4791", opts);
        let mut b = bind("127.0.0.2:4791", opts);
        let mut sizes = vec![1_084; 64];
        sizes.push(500);
        let (buf, ranges) = arena(&sizes, 0);
        let mut batch = datagrams(&buf, &ranges, b.local_addr(), 0);
        batch[3].tos = 0x03; // one control message per send too
        let mut storage = vec![0u8; 8 * 65_536];
        let mut meta = vec![RxMeta::empty(); 8];

        let mut sent = 0;
        let mut received = 0;
        COUNTING.with(|c| c.set(true));
        for _ in 0..100 {
            let mut off = 0;
            let end = Instant::now() + DEADLINE;
            while off < batch.len() {
                assert!(Instant::now() < end, "sent {off} of {}", batch.len());
                off += a.send(&batch[off..]).unwrap();
            }
            sent += off;
            let mut got = 0;
            let end = Instant::now() + DEADLINE;
            while got < batch.len() {
                assert!(Instant::now() < end, "received {got} of {}", batch.len());
                let mut bufs: [IoSliceMut<'_>; 8] = {
                    let mut chunks = storage.chunks_mut(65_536);
                    std::array::from_fn(|_| IoSliceMut::new(chunks.next().unwrap()))
                };
                match b.recv(&mut bufs, &mut meta) {
                    Ok(n) => {
                        got += meta[..n]
                            .iter()
                            .map(|m| m.len.div_ceil(m.stride.max(1)))
                            .sum::<usize>()
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => panic!("{e}"),
                }
            }
            received += got;
        }
        COUNTING.with(|c| c.set(false));
        let allocations = ALLOCATIONS.swap(0, Ordering::Relaxed);
        eprintln!(
            "{opts:?}: {sent} sent, {received} received; sender {:?}",
            a.stats()
        );
        assert_eq!(
            allocations, 0,
            "allocations during 100 rounds with {opts:?}"
        );
        assert_eq!(received, sent);
    }
}
