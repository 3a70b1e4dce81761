//! Queue pairs hammering atomics on shared words while another thread deregisters the region.
//!
//! Checks that the totals are exact for the accesses that succeeded, that nothing touches the
//! memory after `deregister` returns (raw memory: compared with a snapshot; owned memory: freed
//! by `deregister`, which Miri / valgrind would flag as a use after free), and that no 8-byte
//! atomic tears. Run under Miri: `cargo +nightly miri test -p roce-mr --test concurrency`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;

use roce_mr::{Access, AccessError, Key, MrTable, Origin, Pd};
use roce_wire::Qpn;

const WORDS: usize = 4;
const IOVA: u64 = 0x4000_0000;
const RIGHTS: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_ATOMIC)
    .union(Access::REMOTE_READ);
const WORKERS: usize = if cfg!(miri) { 2 } else { 3 };
const ROUNDS_BEFORE: u64 = if cfg!(miri) { 30 } else { 20_000 };

/// One worker: alternates fetch-add(1) and CAS-increment on the words until `stop` is set;
/// returns its successful increments.
fn worker(
    table: &MrTable,
    pd: Pd,
    key: Key,
    id: usize,
    stop: &AtomicBool,
    started: &Barrier,
) -> u64 {
    let origin = Origin::Remote {
        qpn: Qpn::new(id as u32),
    };
    let mut done = 0u64;
    started.wait();
    for i in 0u64.. {
        let iova = IOVA + ((i + id as u64) % WORDS as u64) * 8;
        match table.check(origin, key, pd, iova, 8, Access::REMOTE_ATOMIC) {
            Ok(c) => {
                if i % 2 == 0 {
                    c.fetch_add(1).expect("checked for atomics");
                } else {
                    let mut guess = 0;
                    loop {
                        let orig = c
                            .compare_swap(guess, guess + 1)
                            .expect("checked for atomics");
                        if orig == guess {
                            break;
                        }
                        guess = orig;
                    }
                }
                done += 1;
            }
            Err(AccessError::UnknownKey { .. }) => {}
            Err(e) => panic!("unexpected error {e}"),
        }
        if stop.load(Ordering::Acquire) {
            break;
        }
        if i % 64 == 63 {
            thread::yield_now();
        }
    }
    done
}

#[test]
fn deregister_raw_memory_under_atomic_load() {
    let table = Arc::new(MrTable::new(8, 3));
    let pd = table.alloc_pd();
    // Guard words on both sides must never change.
    let backing: Arc<Vec<AtomicU64>> =
        Arc::new((0..WORDS + 2).map(|_| AtomicU64::new(0)).collect());
    backing[0].store(0xAAAA, Ordering::Relaxed);
    backing[WORDS + 1].store(0xBBBB, Ordering::Relaxed);
    let ptr = backing[1].as_ptr().cast::<u8>();
    // SAFETY: `backing` lives until the end of the test, after `deregister` returns; until then
    // it is only accessed atomically (by the table, and by this test through `AtomicU64`).
    #[allow(unsafe_code)]
    let key = unsafe { table.register_raw(pd, ptr, WORDS * 8, IOVA, RIGHTS) }.expect("register");

    let stop = Arc::new(AtomicBool::new(false));
    let started = Arc::new(Barrier::new(WORKERS + 1));
    let handles: Vec<_> = (0..WORKERS)
        .map(|id| {
            let (table, stop, started) = (table.clone(), stop.clone(), started.clone());
            thread::spawn(move || worker(&table, pd, key, id, &stop, &started))
        })
        .collect();
    started.wait();
    // Let the workers run, then pull the region out from under them.
    let mut seen = 0;
    while seen < ROUNDS_BEFORE {
        seen = backing[1..=WORDS]
            .iter()
            .map(|w| w.load(Ordering::Relaxed))
            .sum();
        thread::yield_now();
    }
    table.deregister(key).expect("deregister");
    let snapshot: Vec<u64> = backing.iter().map(|w| w.load(Ordering::SeqCst)).collect();
    stop.store(true, Ordering::Release);
    let total: u64 = handles.into_iter().map(|h| h.join().expect("worker")).sum();

    let after: Vec<u64> = backing.iter().map(|w| w.load(Ordering::SeqCst)).collect();
    assert_eq!(snapshot, after, "memory touched after deregister returned");
    assert_eq!(after[0], 0xAAAA);
    assert_eq!(after[WORDS + 1], 0xBBBB);
    let sum: u64 = after[1..=WORDS].iter().sum();
    assert_eq!(
        sum, total,
        "every successful increment counted exactly once"
    );
    assert!(total >= ROUNDS_BEFORE);
}

#[test]
fn deregister_owned_memory_under_atomic_load() {
    let table = Arc::new(MrTable::new(8, 4));
    let pd = table.alloc_pd();
    let key = table
        .register_zeroed(pd, WORDS * 8, IOVA, RIGHTS)
        .expect("register");
    let stop = Arc::new(AtomicBool::new(false));
    let started = Arc::new(Barrier::new(WORKERS + 1));
    let handles: Vec<_> = (0..WORKERS)
        .map(|id| {
            let (table, stop, started) = (table.clone(), stop.clone(), started.clone());
            thread::spawn(move || worker(&table, pd, key, id, &stop, &started))
        })
        .collect();
    started.wait();
    let sum = || {
        let mut total = 0;
        for w in 0..WORDS {
            let mut word = [0u8; 8];
            table.read(key, w * 8, &mut word).expect("read own memory");
            total += u64::from_ne_bytes(word);
        }
        total
    };
    while sum() < ROUNDS_BEFORE {
        thread::yield_now();
    }
    // Freeze: a type of "last look" is impossible after deregister (the memory is freed), so
    // stop the workers first, then read the totals, then deregister while they still retry.
    stop.store(true, Ordering::Release);
    let total: u64 = handles.into_iter().map(|h| h.join().expect("worker")).sum();
    assert_eq!(sum(), total);

    // Second round: deregister (freeing the memory) while workers are mid-flight.
    let stop = Arc::new(AtomicBool::new(false));
    let started = Arc::new(Barrier::new(WORKERS + 1));
    let handles: Vec<_> = (0..WORKERS)
        .map(|id| {
            let (table, stop, started) = (table.clone(), stop.clone(), started.clone());
            thread::spawn(move || worker(&table, pd, key, id, &stop, &started))
        })
        .collect();
    started.wait();
    while sum() < total + ROUNDS_BEFORE {
        thread::yield_now();
    }
    table.deregister(key).expect("deregister");
    stop.store(true, Ordering::Release);
    let more: u64 = handles.into_iter().map(|h| h.join().expect("worker")).sum();
    assert!(more >= ROUNDS_BEFORE);
    assert!(table.read(key, 0, &mut [0u8; 8]).is_err());
    table.dealloc_pd(pd).expect("no users left");
}

#[test]
fn copies_and_atomics_on_one_word_never_tear() {
    // Two "peers" write whole aligned words of all-0x11 or all-0x22 bytes while a third reads:
    // every read sees one of the two patterns, never a mix.
    let table = Arc::new(MrTable::new(4, 5));
    let pd = table.alloc_pd();
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let key = table.register_zeroed(pd, 64, 0, access).expect("register");
    table.write(key, 0, &[0x11; 64]).expect("init");
    let rounds = if cfg!(miri) { 20 } else { 20_000 };
    thread::scope(|s| {
        for byte in [0x11u8, 0x22] {
            let table = &table;
            s.spawn(move || {
                for _ in 0..rounds {
                    let c = table
                        .check(
                            Origin::Remote { qpn: Qpn::new(1) },
                            key,
                            pd,
                            0,
                            64,
                            Access::REMOTE_WRITE,
                        )
                        .expect("check");
                    c.write(0, &[byte; 64]).expect("write");
                }
            });
        }
        s.spawn(|| {
            for _ in 0..rounds {
                let c = table
                    .check(
                        Origin::Remote { qpn: Qpn::new(2) },
                        key,
                        pd,
                        8,
                        8,
                        Access::REMOTE_READ,
                    )
                    .expect("check");
                let mut word = [0u8; 8];
                c.read(0, &mut word).expect("read");
                assert!(
                    word == [0x11; 8] || word == [0x22; 8],
                    "torn word {word:x?}"
                );
            }
        });
    });
}
