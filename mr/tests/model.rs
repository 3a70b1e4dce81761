//! Model test: random sequences of register, deregister, fast-reg, invalidate, window
//! alloc/bind/dealloc and accesses, compared with a simple oracle.
//!
//! The oracle is written independently of the table (u128 arithmetic, plain maps). For every
//! access it predicts success or failure exactly: no access outside a live region (or bound
//! window) of the same PD with the needed rights succeeds, every legal one does, and keys from
//! earlier registrations or binds always fail. Successful writes and reads are also checked
//! against a shadow copy of every region's memory, which checks the IOVA translation.

use std::collections::HashMap;

use proptest::prelude::*;
use roce_mr::{Access, BindMw, FastReg, Key, MrTable, MwType, Origin, Pd};
use roce_wire::Qpn;

const CAPACITY: u32 = 8;
const PDS: usize = 2;
const QPS: u32 = 2;

#[derive(Clone, Debug)]
enum Op {
    Register {
        pd: usize,
        len: usize,
        iova: u64,
        access: u32,
    },
    AllocMr {
        pd: usize,
        cap: usize,
    },
    Deregister {
        key: usize,
    },
    FastReg {
        key: usize,
        pd: usize,
        key8: u8,
        offset: usize,
        iova: u64,
        len: u64,
        access: u32,
    },
    Invalidate {
        key: usize,
        pd: usize,
        qpn: u32,
        remote: bool,
    },
    AllocMw {
        pd: usize,
        type2: bool,
    },
    Bind {
        mw: usize,
        mr: usize,
        pd: usize,
        qpn: u32,
        addr: u64,
        len: u64,
        access: u32,
        key8: u8,
    },
    DeallocMw {
        key: usize,
    },
    Access {
        key: usize,
        flip: bool,
        pd: usize,
        local: bool,
        qpn: u32,
        iova: u64,
        len: u64,
        needed: u32,
    },
}

fn iova() -> impl Strategy<Value = u64> {
    prop_oneof![
        8 => prop::sample::select(vec![0u64, 8, 16, 24, 0x1000, 0x1008, 0x1010]),
        2 => 0u64..80,
        1 => prop::sample::select(vec![0x0FF8u64, 0x0FFF, u64::MAX - 16, u64::MAX - 7, u64::MAX]),
    ]
}

/// Mostly PD 0, so that most accesses pass the PD check and reach the later checks.
fn pd() -> impl Strategy<Value = usize> {
    prop_oneof![9 => Just(0usize), 1 => Just(1usize)]
}

fn len() -> impl Strategy<Value = u64> {
    prop_oneof![3 => prop::sample::select(vec![0u64, 1, 8, 16]), 2 => 0u64..40]
}

/// Region rights: mostly useful consistent sets, sometimes anything (including illegal sets).
fn mr_access() -> impl Strategy<Value = u32> {
    prop_oneof![
        6 => prop::sample::select(vec![
            LW | RW | RR | RA | BIND,
            LW | RW | RR | BIND,
            RR | BIND,
            LW | RR,
            RR,
            LW | RW | RR | RA | ZB,
        ]),
        1 => 0u32..0x40,
    ]
}

fn mw_access() -> impl Strategy<Value = u32> {
    prop_oneof![
        6 => prop::sample::select(vec![RR, RW | RR, RA, RR | ZB, RW | RR | RA, RA | ZB]),
        1 => 0u32..0x40,
    ]
}

fn needed() -> impl Strategy<Value = u32> {
    prop_oneof![6 => prop::sample::select(vec![0, LW, RW, RR, RA]), 1 => 0u32..0x10]
}

fn access_op() -> impl Strategy<Value = Op> {
    (
        any::<usize>(),
        prop::bool::weighted(0.1),
        pd(),
        any::<bool>(),
        0..QPS,
        iova(),
        len(),
        needed(),
    )
        .prop_map(
            |(key, flip, pd, local, qpn, iova, len, needed)| Op::Access {
                key,
                flip,
                pd,
                local,
                qpn,
                iova,
                // Atomics mostly with their legal length.
                len: if needed & RA != 0 && key % 5 != 0 {
                    8
                } else {
                    len
                },
                needed,
            },
        )
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (pd(), 0usize..48, iova(), mr_access())
            .prop_map(|(pd, len, iova, access)| Op::Register { pd, len, iova, access }),
        1 => (pd(), 0usize..48).prop_map(|(pd, cap)| Op::AllocMr { pd, cap }),
        3 => any::<usize>().prop_map(|key| Op::Deregister { key }),
        2 => (any::<usize>(), pd(), any::<u8>(), 0usize..24, iova(), len(), mr_access()).prop_map(
            |(key, pd, key8, offset, iova, len, access)| Op::FastReg {
                key,
                pd,
                key8,
                offset,
                iova,
                len,
                access
            }
        ),
        2 => (any::<usize>(), pd(), 0..QPS, any::<bool>())
            .prop_map(|(key, pd, qpn, remote)| Op::Invalidate { key, pd, qpn, remote }),
        2 => (pd(), any::<bool>()).prop_map(|(pd, type2)| Op::AllocMw { pd, type2 }),
        3 => (any::<usize>(), any::<usize>(), pd(), 0..QPS, iova(), len(), mw_access(), any::<u8>())
            .prop_map(|(mw, mr, pd, qpn, addr, len, access, key8)| Op::Bind {
                mw,
                mr,
                pd,
                qpn,
                addr,
                len,
                access,
                key8
            }),
        1 => any::<usize>().prop_map(|key| Op::DeallocMw { key }),
        10 => access_op(),
    ]
}

/// The oracle's view of one live object.
#[derive(Clone, Debug)]
enum Obj {
    Mr {
        pd: usize,
        fast: bool,
        valid: bool,
        iova: u64,
        len: u64,
        offset: usize,
        access: u32,
        mem: Vec<u8>,
        windows: u32,
    },
    Mw {
        pd: usize,
        type2: bool,
        bound: Option<Win>,
    },
}

#[derive(Clone, Debug)]
struct Win {
    mr: u32,
    /// Byte offset of the window start in the region's memory.
    mem_offset: usize,
    base: u64,
    len: u64,
    access: u32,
    qpn: Option<u32>,
}

#[derive(Default)]
struct Model {
    objs: HashMap<u32, (u8, Obj)>,
}

const LW: u32 = 1;
const RW: u32 = 2;
const RR: u32 = 4;
const RA: u32 = 8;
const BIND: u32 = 0x10;
const ZB: u32 = 0x20;

fn consistent(a: u32) -> bool {
    a & (RW | RA) == 0 || a & LW != 0
}

fn inside(start: u64, len: u64, lo: u64, hi_len: u64) -> bool {
    let (s, e) = (u128::from(start), u128::from(start) + u128::from(len));
    s >= u128::from(lo) && e <= u128::from(lo) + u128::from(hi_len)
}

impl Model {
    fn live(&self, key: Key) -> Option<&Obj> {
        self.objs
            .get(&key.index())
            .filter(|(k8, _)| *k8 == key.key8())
            .map(|(_, o)| o)
    }

    /// Predicts an access: `Some((mr index, memory offset))` when it must succeed (non-empty),
    /// `Some((0, 0))` for an empty success, `None` when it must fail.
    fn access(
        &self,
        key: Key,
        pd: usize,
        qpn: Option<u32>,
        iova: u64,
        len: u64,
        needed: u32,
    ) -> Option<(u32, usize)> {
        let atomic = needed & RA != 0;
        if len == 0 && !atomic {
            return Some((0, 0));
        }
        if atomic && (len != 8 || iova % 8 != 0) {
            return None;
        }
        match self.live(key)? {
            Obj::Mr {
                pd: p,
                valid,
                iova: base,
                len: l,
                offset,
                access,
                ..
            } => {
                let ok =
                    *p == pd && *valid && access & needed == needed && inside(iova, len, *base, *l);
                let off = offset.wrapping_add(iova.wrapping_sub(*base) as usize);
                // Region memory is 8-byte aligned at offset 0.
                (ok && (!atomic || off % 8 == 0)).then_some((key.index(), off))
            }
            Obj::Mw { pd: p, bound, .. } => {
                let qpn = qpn?;
                let w = bound.as_ref()?;
                let ok = *p == pd
                    && w.qpn.is_none_or(|q| q == qpn)
                    && w.access & needed == needed
                    && inside(iova, len, w.base, w.len);
                let off = w
                    .mem_offset
                    .wrapping_add(iova.wrapping_sub(w.base) as usize);
                (ok && (!atomic || off % 8 == 0)).then_some((w.mr, off))
            }
        }
    }
}

/// A key the table issued: three times in four one that `want` accepts (live, of the right kind)
/// when there is one, else any issued key (often stale).
fn choose(keys: &[Key], i: usize, want: impl Fn(Key) -> bool) -> Key {
    let wanted: Vec<Key> = keys.iter().copied().filter(|k| want(*k)).collect();
    match (keys.len(), wanted.len()) {
        (0, _) => Key::new(1, 0),
        (n, 0) => keys[(i / 4) % n],
        (n, _) if i % 4 == 0 => keys[(i / 4) % n],
        (_, w) => wanted[(i / 4) % w],
    }
}

fn run(ops: Vec<Op>, seed: u64) {
    let t = MrTable::new(CAPACITY, seed);
    let pds: Vec<Pd> = (0..PDS).map(|_| t.alloc_pd()).collect();
    let mut m = Model::default();
    // Every key the table ever returned, live or stale.
    let mut keys: Vec<Key> = Vec::new();
    // Slots whose 8-bit key the application chose (fast registration, memory-window bind):
    // verbs lets it pick any value, so a later automatic key at that index may repeat an old
    // one; there, freshness only means "differs from the slot's previous key".
    let mut user_keyed: HashMap<u32, Key> = HashMap::new();
    let mut fill = 1u8;
    for op in ops {
        match op {
            Op::Register {
                pd,
                len,
                iova,
                access,
            } => {
                let legal = consistent(access)
                    && (access & ZB == 0 || iova == 0)
                    && iova.checked_add(len as u64).is_some();
                let full = m.objs.len() as u32 == CAPACITY;
                let r = t.register_zeroed(pds[pd], len, iova, Access::from_bits(access).unwrap());
                assert_eq!(r.is_ok(), legal && !full, "{op:?} -> {r:?}");
                if let Ok(k) = r {
                    match user_keyed.get(&k.index()) {
                        Some(prev) => assert_ne!(k, *prev, "key of a reused slot repeats"),
                        None => assert!(!keys.contains(&k), "fresh key {k:?} was issued before"),
                    }
                    let obj = Obj::Mr {
                        pd,
                        fast: false,
                        valid: true,
                        iova,
                        len: len as u64,
                        offset: 0,
                        access,
                        mem: vec![0; len],
                        windows: 0,
                    };
                    assert!(m.objs.insert(k.index(), (k.key8(), obj)).is_none());
                    keys.push(k);
                }
            }
            Op::AllocMr { pd, cap } => {
                let full = m.objs.len() as u32 == CAPACITY;
                let r = t.alloc_mr(pds[pd], cap);
                assert_eq!(r.is_ok(), !full);
                if let Ok(k) = r {
                    let obj = Obj::Mr {
                        pd,
                        fast: true,
                        valid: false,
                        iova: 0,
                        len: 0,
                        offset: 0,
                        access: 0,
                        mem: vec![0; cap],
                        windows: 0,
                    };
                    assert!(m.objs.insert(k.index(), (k.key8(), obj)).is_none());
                    keys.push(k);
                }
            }
            Op::Deregister { key } => {
                let k = choose(&keys, key, |k| m.live(k).is_some());
                let legal = matches!(m.live(k), Some(Obj::Mr { windows: 0, .. }));
                let r = t.deregister(k);
                assert_eq!(r.is_ok(), legal, "{op:?} {k:?} -> {r:?}");
                if legal {
                    m.objs.remove(&k.index());
                }
            }
            Op::FastReg {
                key,
                pd,
                key8,
                offset,
                iova,
                len,
                access,
            } => {
                let k = choose(&keys, key, |k| {
                    matches!(m.live(k), Some(Obj::Mr { fast: true, .. }))
                })
                .with_key8(key8);
                let legal = match m.objs.get(&k.index()) {
                    Some((
                        _,
                        Obj::Mr {
                            pd: p,
                            fast: true,
                            valid: false,
                            mem,
                            ..
                        },
                    )) => {
                        *p == pd
                            && consistent(access)
                            && (access & ZB == 0 || iova == 0)
                            && iova.checked_add(len).is_some()
                            && offset as u64 + len <= mem.len() as u64
                    }
                    _ => false,
                };
                let r = t.fast_reg(
                    k,
                    pds[pd],
                    FastReg {
                        offset,
                        iova,
                        len,
                        access: Access::from_bits(access).unwrap(),
                    },
                );
                assert_eq!(r.is_ok(), legal, "{op:?} -> {r:?}");
                if legal {
                    let (k8, obj) = m.objs.get_mut(&k.index()).unwrap();
                    *k8 = key8;
                    if let Obj::Mr {
                        valid,
                        iova: i,
                        len: l,
                        offset: o,
                        access: a,
                        ..
                    } = obj
                    {
                        (*valid, *i, *l, *o, *a) = (true, iova, len, offset, access);
                    }
                    user_keyed.insert(k.index(), k);
                    if !keys.contains(&k) {
                        keys.push(k);
                    }
                }
            }
            Op::Invalidate {
                key,
                pd,
                qpn,
                remote,
            } => {
                let k = choose(&keys, key, |k| m.live(k).is_some());
                let legal = match m.live(k) {
                    Some(Obj::Mr {
                        pd: p,
                        fast,
                        valid,
                        windows,
                        ..
                    }) => *p == pd && *fast && *valid && *windows == 0,
                    Some(Obj::Mw {
                        pd: p,
                        type2: true,
                        bound: Some(w),
                    }) => *p == pd && w.qpn == Some(qpn),
                    _ => false,
                };
                let r = if remote {
                    t.invalidate_remote(k, pds[pd], Qpn::new(qpn))
                } else {
                    t.invalidate_local(k, pds[pd], Qpn::new(qpn))
                };
                assert_eq!(r.is_ok(), legal, "{op:?} -> {r:?}");
                if legal {
                    let mut unref = None;
                    match &mut m.objs.get_mut(&k.index()).unwrap().1 {
                        Obj::Mr { valid, .. } => *valid = false,
                        Obj::Mw { bound, .. } => unref = bound.take().map(|w| w.mr),
                    }
                    if let Some(mr) = unref {
                        if let Some((_, Obj::Mr { windows, .. })) = m.objs.get_mut(&mr) {
                            *windows -= 1;
                        }
                    }
                }
            }
            Op::AllocMw { pd, type2 } => {
                let full = m.objs.len() as u32 == CAPACITY;
                let ty = if type2 { MwType::Type2 } else { MwType::Type1 };
                let r = t.alloc_mw(pds[pd], ty);
                assert_eq!(r.is_ok(), !full);
                if let Ok(k) = r {
                    assert!(m
                        .objs
                        .insert(
                            k.index(),
                            (
                                k.key8(),
                                Obj::Mw {
                                    pd,
                                    type2,
                                    bound: None
                                }
                            )
                        )
                        .is_none());
                    keys.push(k);
                }
            }
            Op::Bind {
                mw,
                mr,
                pd,
                qpn,
                addr,
                len,
                access,
                key8,
            } => {
                let (mwk, mrk) = (
                    choose(&keys, mw, |k| matches!(m.live(k), Some(Obj::Mw { .. }))),
                    choose(&keys, mr, |k| {
                        matches!(m.live(k), Some(Obj::Mr { valid: true, .. }))
                    }),
                );
                let target = if len == 0 {
                    Some(None)
                } else if mrk.index() == mwk.index() {
                    None
                } else {
                    match m.live(mrk) {
                        Some(Obj::Mr {
                            pd: p,
                            valid: true,
                            iova,
                            len: l,
                            offset,
                            access: a,
                            ..
                        }) if *p == pd
                            && a & ZB == 0
                            && a & BIND != 0
                            && (access & (RW | RA) == 0 || a & LW != 0)
                            && inside(addr, len, *iova, *l) =>
                        {
                            Some(Some(offset + (addr - iova) as usize))
                        }
                        _ => None,
                    }
                };
                let legal = access & !(RW | RR | RA | ZB) == 0
                    && match m.live(mwk) {
                        Some(Obj::Mw {
                            pd: p,
                            type2: false,
                            ..
                        }) => *p == pd && access & ZB == 0 && target.is_some(),
                        Some(Obj::Mw {
                            pd: p,
                            type2: true,
                            bound: None,
                        }) => *p == pd && len != 0 && target.is_some(),
                        _ => false,
                    };
                let bind = BindMw {
                    mr: mrk,
                    addr,
                    len,
                    access: Access::from_bits(access).unwrap(),
                    key8,
                };
                let r = t.bind_mw(mwk, pds[pd], Qpn::new(qpn), bind);
                assert_eq!(r.is_ok(), legal, "{op:?} {mwk:?} {mrk:?} -> {r:?}");
                if let Ok(newk) = r {
                    assert_eq!(newk, mwk.with_key8(key8));
                    let (k8, obj) = m.objs.get_mut(&mwk.index()).unwrap();
                    *k8 = key8;
                    let Obj::Mw { type2, bound, .. } = obj else {
                        unreachable!()
                    };
                    let new = target.flatten().map(|mem_offset| Win {
                        mr: mrk.index(),
                        mem_offset,
                        base: if access & ZB != 0 { 0 } else { addr },
                        len,
                        access,
                        qpn: type2.then_some(qpn),
                    });
                    let old = std::mem::replace(bound, new.clone());
                    for (w, d) in [(old, -1i32), (new, 1)] {
                        if let Some(w) = w {
                            if let Some((_, Obj::Mr { windows, .. })) = m.objs.get_mut(&w.mr) {
                                *windows = windows.checked_add_signed(d).unwrap();
                            }
                        }
                    }
                    user_keyed.insert(newk.index(), newk);
                    if !keys.contains(&newk) {
                        keys.push(newk);
                    }
                }
            }
            Op::DeallocMw { key } => {
                let k = choose(&keys, key, |k| matches!(m.live(k), Some(Obj::Mw { .. })));
                let legal = matches!(m.live(k), Some(Obj::Mw { .. }));
                let r = t.dealloc_mw(k);
                assert_eq!(r.is_ok(), legal, "{op:?} -> {r:?}");
                if legal {
                    if let Some((_, Obj::Mw { bound: Some(w), .. })) = m.objs.remove(&k.index()) {
                        if let Some((_, Obj::Mr { windows, .. })) = m.objs.get_mut(&w.mr) {
                            *windows -= 1;
                        }
                    }
                }
            }
            Op::Access {
                key,
                flip,
                pd,
                local,
                qpn,
                iova,
                len,
                needed,
            } => {
                let mut k = choose(&keys, key, |k| m.live(k).is_some());
                if flip {
                    k = k.with_key8(k.key8().wrapping_add(1));
                }
                let (origin, q) = if local {
                    (Origin::Local, None)
                } else {
                    (Origin::Remote { qpn: Qpn::new(qpn) }, Some(qpn))
                };
                let predicted = m.access(k, pd, q, iova, len, needed);
                let r = t.check(
                    origin,
                    k,
                    pds[pd],
                    iova,
                    len,
                    Access::from_bits(needed).unwrap(),
                );
                assert_eq!(r.is_ok(), predicted.is_some(), "{op:?} {k:?} -> {r:?}");
                let (Ok(c), Some((mr, off))) = (r, predicted) else {
                    continue;
                };
                if len == 0 {
                    continue;
                }
                let Some((_, Obj::Mr { mem, .. })) = m.objs.get_mut(&mr) else {
                    panic!("window without region")
                };
                let n = len as usize;
                if needed & RA != 0 {
                    let orig = u64::from_ne_bytes(mem[off..off + 8].try_into().unwrap());
                    assert_eq!(c.fetch_add(3).unwrap(), orig);
                    mem[off..off + 8].copy_from_slice(&orig.wrapping_add(3).to_ne_bytes());
                } else if needed & (LW | RW) != 0 {
                    fill = fill.wrapping_add(1);
                    let data: Vec<u8> = (0..n).map(|i| fill.wrapping_add(i as u8)).collect();
                    c.write(0, &data).unwrap();
                    mem[off..off + n].copy_from_slice(&data);
                } else if local || needed & RR != 0 {
                    let mut got = vec![0u8; n];
                    c.read(0, &mut got).unwrap();
                    assert_eq!(got, mem[off..off + n], "translation of {k:?} at {iova:#x}");
                }
            }
        }
    }
    // Every region's memory matches the shadow copy (the application's view).
    for (index, (k8, obj)) in &m.objs {
        if let Obj::Mr { mem, .. } = obj {
            let mut got = vec![0u8; mem.len()];
            t.read(Key::new(*index, *k8), 0, &mut got).unwrap();
            assert_eq!(&got, mem);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn table_matches_model(ops in prop::collection::vec(op(), 1..120), seed in any::<u64>()) {
        run(ops, seed);
    }
}
