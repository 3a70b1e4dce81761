//! The daemon's state, without I/O: who is connected, which QPN range each holds, which
//! ranges wait out their quarantine, what each client and each uid has reserved. Time comes
//! in as an argument, so the tests drive it.
//!
//! # QPN ranges
//!
//! The 24-bit QPN space is cut into `2^24 / range_size` slots; slot `s` is QPNs
//! `s × range_size ..= (s + 1) × range_size - 1`. Slot 0 (QP0, QP1 and the low numbers) is
//! the daemon's. A client gets the next free slot after the last one handed out (so a freed
//! slot is reused as late as possible), keeps it while its connection lives, and when the
//! connection ends the slot waits `quarantine` before anyone can have it: packets still in
//! flight for the dead client's QPs are dropped, never delivered to a new owner.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use roce_transport::control::sys::PeerCred;
use roce_transport::control::{
    ClientView, ControlError, DaemonStats, Lease, Mode, Objects, Report, Resource, Role, Scope,
};

use super::config::{Config, ObjectLimits};

/// A connection's number (never reused while the daemon runs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ClientId(pub(crate) u64);

/// The policy the registry applies (from the config).
#[derive(Clone, Debug)]
pub(crate) struct Policy {
    pub(crate) mode: Mode,
    pub(crate) range_size: u32,
    pub(crate) slots: u32,
    pub(crate) quarantine: Duration,
    pub(crate) max_clients: Option<u32>,
    pub(crate) per_uid: ObjectLimits,
    pub(crate) per_client: ObjectLimits,
}

impl Policy {
    pub(crate) fn from_config(c: &Config) -> Self {
        Self {
            mode: c.mode,
            range_size: c.qpn.range_size,
            slots: c.slots(),
            quarantine: c.quarantine(),
            max_clients: c.limits.max_clients,
            per_uid: c.limits.per_uid,
            per_client: c.limits.per_client,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    /// The daemon's own (slot 0).
    Daemon,
    Free,
    Owned(ClientId),
    Quarantined {
        until: Instant,
    },
    /// A member the daemon does not know holds it (a client of an earlier daemon run, with a
    /// pinned demultiplexer): out of circulation until its socket goes.
    Orphan,
}

#[derive(Debug)]
struct Client {
    cred: PeerCred,
    comm: String,
    role: Role,
    lease: Option<Lease>,
    objects: Objects,
    report: Report,
    report_at: Instant,
}

/// What [`Registry::disconnect`] did with a client that held a range.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Reaped {
    pub(crate) pid: u32,
    pub(crate) uid: u32,
    pub(crate) comm: String,
    pub(crate) slot: u32,
    pub(crate) objects: Objects,
    pub(crate) quarantined_until: Instant,
}

/// The daemon's state.
#[derive(Debug)]
pub(crate) struct Registry {
    policy: Policy,
    slots: Vec<Slot>,
    /// The slot the last allocation took (the next search starts after it).
    cursor: u32,
    clients: BTreeMap<ClientId, Client>,
    reaped: u64,
    refusals: u64,
}

impl Registry {
    pub(crate) fn new(policy: Policy) -> Self {
        let mut slots = vec![Slot::Free; policy.slots as usize];
        slots[0] = Slot::Daemon;
        Self {
            policy,
            slots,
            cursor: 0,
            clients: BTreeMap::new(),
            reaped: 0,
            refusals: 0,
        }
    }

    /// A new connection (after its hello).
    pub(crate) fn connect(
        &mut self,
        id: ClientId,
        cred: PeerCred,
        comm: String,
        role: Role,
        now: Instant,
    ) {
        self.clients.insert(
            id,
            Client {
                cred,
                comm,
                role,
                lease: None,
                objects: Objects::default(),
                report: Report::default(),
                report_at: now,
            },
        );
    }

    /// Ends the quarantines that are over; returns the slots back in service.
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<u32> {
        let mut back = Vec::new();
        for (i, s) in self.slots.iter_mut().enumerate() {
            if let Slot::Quarantined { until } = *s {
                if until <= now {
                    *s = Slot::Free;
                    back.push(i as u32);
                }
            }
        }
        back
    }

    /// Whether `id` may take a QPN range: a device connection without one, and in
    /// kernel-demux mode of the uid that holds ranges already (if any). Returns its uid.
    fn may_take_range(&self, id: ClientId) -> Result<u32, ControlError> {
        let Some(c) = self.clients.get(&id) else {
            return Err(ControlError::BadRequest {
                reason: "unknown connection".into(),
            });
        };
        if c.role != Role::Device {
            return Err(ControlError::BadRequest {
                reason: "a view connection cannot hold a QPN range".into(),
            });
        }
        if let Some(l) = &c.lease {
            return Err(ControlError::AlreadyHasRange { slot: l.slot });
        }
        let uid = c.cred.uid;
        if self.policy.mode == Mode::KernelDemux {
            if let Some(other) = self
                .clients
                .values()
                .find(|c| c.lease.is_some() && c.cred.uid != uid)
            {
                return Err(ControlError::Forbidden { reason: format!(
                    "kernel-demux mode serves one trust domain: uid {} holds QPN ranges, uid {uid} may not join (a member socket could take the others' datagrams); use mode = \"forwarding\" for several users",
                    other.cred.uid
                ) });
            }
        }
        Ok(uid)
    }

    /// Gives `slot` to `id`: the slot is owned, the client holds the lease.
    fn grant(&mut self, id: ClientId, slot: u32) -> Lease {
        self.slots[slot as usize] = Slot::Owned(id);
        let lease = Lease {
            slot,
            qpn_base: slot * self.policy.range_size,
            qpn_count: self.policy.range_size,
            mode: self.policy.mode,
            demux_fds: false,
            ring_fds: false,
        };
        if let Some(c) = self.clients.get_mut(&id) {
            c.lease = Some(lease.clone());
        }
        lease
    }

    /// Gives `id` a QPN range.
    ///
    /// # Errors
    /// [`ControlError`]: the connection is a viewer or holds a range already, a clients
    /// limit, another uid holds ranges in kernel-demux mode, or no free range.
    ///
    /// `occupied(slot)` says whether the data path already has a member in a slot; such a
    /// slot (a client of an earlier daemon run) becomes an orphan, never handed out while
    /// occupied.
    pub(crate) fn alloc_range(
        &mut self,
        id: ClientId,
        now: Instant,
        occupied: &dyn Fn(u32) -> bool,
    ) -> Result<Lease, ControlError> {
        self.expire(now);
        let r = self.try_alloc(id, occupied);
        if matches!(r, Err(ControlError::LimitExceeded { .. })) {
            self.refusals += 1;
        }
        r
    }

    fn try_alloc(
        &mut self,
        id: ClientId,
        occupied: &dyn Fn(u32) -> bool,
    ) -> Result<Lease, ControlError> {
        let uid = self.may_take_range(id)?;
        let holders = || self.clients.values().filter(|c| c.lease.is_some());
        let all = holders().count() as u64;
        if let Some(max) = self.policy.max_clients {
            check(Resource::Clients, Scope::Daemon, u64::from(max), all, 1)?;
        }
        if let Some(max) = self.policy.per_uid.clients {
            let mine = holders().filter(|c| c.cred.uid == uid).count() as u64;
            check(Resource::Clients, Scope::Uid, u64::from(max), mine, 1)?;
        }
        let n = self.slots.len() as u32;
        let mut pick = None;
        for s in (1..=n).map(|i| (self.cursor + i) % n) {
            if self.slots[s as usize] != Slot::Free {
                continue;
            }
            if occupied(s) {
                self.slots[s as usize] = Slot::Orphan;
                continue;
            }
            pick = Some(s);
            break;
        }
        let slot = pick.ok_or_else(|| ControlError::NoFreeRange {
            quarantined: self
                .slots
                .iter()
                .filter(|s| matches!(s, Slot::Quarantined { .. }))
                .count() as u32,
        })?;
        self.cursor = slot;
        Ok(self.grant(id, slot))
    }

    /// Gives `id` back the range at `slot` it held under an earlier daemon run (the server
    /// has checked that `id`'s socket is the slot's member), with the `objects` it holds.
    /// Limits are not applied to what exists already; the one-uid rule of kernel demux is.
    ///
    /// # Errors
    /// [`ControlError`]: not a device connection, it holds a range already, another uid holds
    /// ranges in kernel-demux mode, or the slot is not one a member of an earlier run can
    /// hold (the daemon's, another client's, or quarantined).
    pub(crate) fn adopt(
        &mut self,
        id: ClientId,
        slot: u32,
        objects: Objects,
    ) -> Result<Lease, ControlError> {
        self.may_take_range(id)?;
        match self.slots.get(slot as usize) {
            Some(Slot::Free | Slot::Orphan) => {}
            _ => {
                return Err(ControlError::Forbidden {
                    reason: format!("QPN range slot {slot} cannot be resumed"),
                })
            }
        }
        let lease = self.grant(id, slot);
        if let Some(c) = self.clients.get_mut(&id) {
            c.objects = objects;
        }
        Ok(lease)
    }

    /// Reserves `want` for `id`.
    ///
    /// # Errors
    /// [`ControlError::NoRange`] before a range; [`ControlError::LimitExceeded`]: a
    /// per-client or per-uid limit (nothing is reserved then).
    pub(crate) fn reserve(&mut self, id: ClientId, want: Objects) -> Result<(), ControlError> {
        let r = self.try_reserve(id, want);
        if matches!(r, Err(ControlError::LimitExceeded { .. })) {
            self.refusals += 1;
        }
        r
    }

    fn try_reserve(&mut self, id: ClientId, want: Objects) -> Result<(), ControlError> {
        let Some(c) = self.clients.get(&id) else {
            return Err(ControlError::BadRequest {
                reason: "unknown connection".into(),
            });
        };
        if c.lease.is_none() {
            return Err(ControlError::NoRange);
        }
        let uid = c.cred.uid;
        check_objects(&self.policy.per_client, Scope::Client, c.objects, want)?;
        let uid_total = self
            .clients
            .values()
            .filter(|c| c.cred.uid == uid)
            .fold(Objects::default(), |a, c| a.plus(c.objects));
        check_objects(&self.policy.per_uid, Scope::Uid, uid_total, want)?;
        if let Some(c) = self.clients.get_mut(&id) {
            c.objects = c.objects.plus(want);
        }
        Ok(())
    }

    /// Returns objects `id` reserved.
    pub(crate) fn release(&mut self, id: ClientId, objects: Objects) {
        if let Some(c) = self.clients.get_mut(&id) {
            c.objects = c.objects.minus(objects);
        }
    }

    /// Keeps `id`'s latest snapshot.
    pub(crate) fn report(&mut self, id: ClientId, report: Report, now: Instant) {
        if let Some(c) = self.clients.get_mut(&id) {
            c.report = report;
            c.report_at = now;
        }
    }

    /// The connection `id` ended: its objects are forgotten and its range quarantined.
    pub(crate) fn disconnect(&mut self, id: ClientId, now: Instant) -> Option<Reaped> {
        let c = self.clients.remove(&id)?;
        let lease = c.lease?;
        let until = now + self.policy.quarantine;
        self.slots[lease.slot as usize] = Slot::Quarantined { until };
        self.reaped += 1;
        Some(Reaped {
            pid: c.cred.pid,
            uid: c.cred.uid,
            comm: c.comm,
            slot: lease.slot,
            objects: c.objects,
            quarantined_until: until,
        })
    }

    /// The orphaned slots.
    pub(crate) fn orphans(&self) -> Vec<u32> {
        (0..self.slots.len() as u32)
            .filter(|&s| self.slots[s as usize] == Slot::Orphan)
            .collect()
    }

    /// An orphan's member is gone: the slot waits out the quarantine like any other.
    pub(crate) fn orphan_gone(&mut self, slot: u32, now: Instant) {
        if let Some(s @ Slot::Orphan) = self.slots.get_mut(slot as usize) {
            *s = Slot::Quarantined {
                until: now + self.policy.quarantine,
            };
        }
    }

    /// Every device client holding a range, oldest connection first.
    pub(crate) fn views(&self, now: Instant) -> Vec<ClientView> {
        self.clients
            .values()
            .filter(|c| c.lease.is_some())
            .map(|c| ClientView {
                pid: c.cred.pid,
                uid: c.cred.uid,
                gid: c.cred.gid,
                comm: c.comm.clone(),
                lease: c.lease.clone(),
                objects: c.objects,
                report: c.report.clone(),
                report_age_ms: now.saturating_duration_since(c.report_at).as_millis() as u64,
            })
            .collect()
    }

    /// The daemon's counters.
    pub(crate) fn stats(&mut self, now: Instant) -> DaemonStats {
        self.expire(now);
        let count = |f: fn(&Slot) -> bool| self.slots.iter().filter(|s| f(s)).count() as u32;
        DaemonStats {
            clients: self.clients.values().filter(|c| c.lease.is_some()).count() as u32,
            slots_free: count(|s| *s == Slot::Free),
            slots_quarantined: count(|s| matches!(s, Slot::Quarantined { .. })),
            clients_reaped: self.reaped,
            limit_refusals: self.refusals,
            ..DaemonStats::default()
        }
    }
}

fn check(
    resource: Resource,
    scope: Scope,
    limit: u64,
    in_use: u64,
    requested: u64,
) -> Result<(), ControlError> {
    if in_use.saturating_add(requested) > limit {
        return Err(ControlError::LimitExceeded {
            resource,
            scope,
            limit,
            in_use,
            requested,
        });
    }
    Ok(())
}

fn check_objects(
    l: &ObjectLimits,
    scope: Scope,
    have: Objects,
    want: Objects,
) -> Result<(), ControlError> {
    let pairs = [
        (Resource::Qps, l.qps.map(u64::from), have.qps, want.qps),
        (Resource::Cqs, l.cqs.map(u64::from), have.cqs, want.cqs),
        (Resource::Mrs, l.mrs.map(u64::from), have.mrs, want.mrs),
    ];
    for (r, limit, have, want) in pairs {
        if let Some(limit) = limit {
            if want > 0 {
                check(r, scope, limit, u64::from(have), u64::from(want))?;
            }
        }
    }
    if let Some(limit) = l.mr_bytes {
        if want.mr_bytes > 0 {
            check(
                Resource::MrBytes,
                scope,
                limit,
                have.mr_bytes,
                want.mr_bytes,
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    /// A data path with no member anywhere.
    const NONE: fn(u32) -> bool = |_| false;

    fn policy(range_size: u32) -> Policy {
        Policy {
            mode: Mode::KernelDemux,
            range_size,
            slots: (1 << 24) / range_size,
            quarantine: Duration::from_millis(100),
            max_clients: None,
            per_uid: ObjectLimits::default(),
            per_client: ObjectLimits::default(),
        }
    }

    fn cred(pid: u32, uid: u32) -> PeerCred {
        PeerCred { pid, uid, gid: uid }
    }

    fn device(r: &mut Registry, id: u64, uid: u32, now: Instant) -> ClientId {
        let id = ClientId(id);
        r.connect(
            id,
            cred(1000 + id.0 as u32, uid),
            "t".into(),
            Role::Device,
            now,
        );
        id
    }

    /// A dead client's range is not handed out again before its quarantine ends, and is
    /// afterwards.
    #[test]
    fn a_reaped_range_is_reused_only_after_the_quarantine() {
        // Two client slots (range 2^23): the only choice after a death is the dead one's.
        let mut r = Registry::new(policy(1 << 23));
        let t0 = Instant::now();
        let a = device(&mut r, 1, 0, t0);
        let la = r.alloc_range(a, t0, &NONE).unwrap();
        assert_eq!(la.slot, 1);
        assert_eq!((la.qpn_base, la.qpn_count), (1 << 23, 1 << 23));
        let reaped = r.disconnect(a, t0).unwrap();
        assert_eq!(reaped.slot, 1);
        assert_eq!(reaped.quarantined_until, t0 + Duration::from_millis(100));
        let b = device(&mut r, 2, 0, t0);
        let e = r
            .alloc_range(b, t0 + Duration::from_millis(99), &NONE)
            .unwrap_err();
        assert_eq!(e, ControlError::NoFreeRange { quarantined: 1 });
        assert_eq!(r.stats(t0).slots_quarantined, 1);
        let lb = r
            .alloc_range(b, t0 + Duration::from_millis(100), &NONE)
            .unwrap();
        assert_eq!(lb.slot, 1);
        assert_eq!(r.stats(t0).clients_reaped, 1);
    }

    /// Slot 0 (QP0/QP1 and the low QPNs) is never handed out, and the next allocation starts
    /// after the last one, so a freed slot is reused as late as possible.
    #[test]
    fn slot_zero_is_the_daemons_and_allocation_rotates() {
        let mut r = Registry::new(policy(1 << 22)); // slots 0..4
        let t = Instant::now();
        let ids: Vec<_> = (1..=3).map(|i| device(&mut r, i, 0, t)).collect();
        let slots: Vec<_> = ids
            .iter()
            .map(|&i| r.alloc_range(i, t, &NONE).unwrap().slot)
            .collect();
        assert_eq!(slots, [1, 2, 3]);
        let mut zero = Registry::new(Policy {
            quarantine: Duration::ZERO,
            ..policy(1 << 22)
        });
        let a = device(&mut zero, 1, 0, t);
        assert_eq!(zero.alloc_range(a, t, &NONE).unwrap().slot, 1);
        zero.disconnect(a, t);
        let b = device(&mut zero, 2, 0, t);
        assert_eq!(
            zero.alloc_range(b, t, &NONE).unwrap().slot,
            2,
            "not the one just freed"
        );
    }

    #[test]
    fn a_connection_holds_one_range_and_viewers_none() {
        let mut r = Registry::new(policy(1 << 16));
        let t = Instant::now();
        let a = device(&mut r, 1, 0, t);
        let slot = r.alloc_range(a, t, &NONE).unwrap().slot;
        assert_eq!(
            r.alloc_range(a, t, &NONE),
            Err(ControlError::AlreadyHasRange { slot })
        );
        let v = ClientId(9);
        r.connect(v, cred(9, 0), "v".into(), Role::View, t);
        assert!(matches!(
            r.alloc_range(v, t, &NONE),
            Err(ControlError::BadRequest { .. })
        ));
        assert_eq!(r.reserve(v, Objects::qp()), Err(ControlError::NoRange));
        assert_eq!(r.views(t).len(), 1, "viewers are not listed");
    }

    /// Per-client and per-uid limits refuse with a typed error naming the limit, and the
    /// refusal reserves nothing; a release makes room again.
    #[test]
    fn limits_refuse_with_a_typed_error() {
        let mut r = Registry::new(Policy {
            max_clients: Some(3),
            per_client: ObjectLimits {
                qps: Some(2),
                mr_bytes: Some(100),
                ..ObjectLimits::default()
            },
            per_uid: ObjectLimits {
                clients: Some(2),
                qps: Some(3),
                ..ObjectLimits::default()
            },
            ..policy(1 << 16)
        });
        let t = Instant::now();
        let a = device(&mut r, 1, 7, t);
        let b = device(&mut r, 2, 7, t);
        r.alloc_range(a, t, &NONE).unwrap();
        r.alloc_range(b, t, &NONE).unwrap();
        r.reserve(a, Objects::qp()).unwrap();
        r.reserve(a, Objects::qp()).unwrap();
        let e = r.reserve(a, Objects::qp()).unwrap_err();
        assert_eq!(
            e,
            ControlError::LimitExceeded {
                resource: Resource::Qps,
                scope: Scope::Client,
                limit: 2,
                in_use: 2,
                requested: 1
            }
        );
        r.reserve(b, Objects::qp()).unwrap();
        let e = r.reserve(b, Objects::qp()).unwrap_err();
        assert!(
            matches!(
                e,
                ControlError::LimitExceeded {
                    resource: Resource::Qps,
                    scope: Scope::Uid,
                    limit: 3,
                    in_use: 3,
                    ..
                }
            ),
            "{e:?}"
        );
        let e = r.reserve(a, Objects::mr(101)).unwrap_err();
        assert!(matches!(
            e,
            ControlError::LimitExceeded {
                resource: Resource::MrBytes,
                ..
            }
        ));
        r.reserve(a, Objects::mr(100)).unwrap();
        r.release(a, Objects::qp());
        r.reserve(b, Objects::qp()).unwrap();
        // A third client of uid 7: the per-uid clients limit.
        let c = device(&mut r, 3, 7, t);
        let e = r.alloc_range(c, t, &NONE).unwrap_err();
        assert!(
            matches!(
                e,
                ControlError::LimitExceeded {
                    resource: Resource::Clients,
                    scope: Scope::Uid,
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(r.stats(t).limit_refusals, 4);
        let views = r.views(t);
        assert_eq!(views[0].objects.qps, 1);
        assert_eq!(views[0].objects.mr_bytes, 100);
    }

    /// Kernel demux shares the port between sockets that can steal each other's datagrams:
    /// the daemon keeps it to one uid at a time.
    #[test]
    fn kernel_demux_refuses_a_second_uid() {
        let mut r = Registry::new(policy(1 << 16));
        let t = Instant::now();
        let a = device(&mut r, 1, 1000, t);
        r.alloc_range(a, t, &NONE).unwrap();
        let b = device(&mut r, 2, 1001, t);
        let e = r.alloc_range(b, t, &NONE).unwrap_err();
        assert!(
            matches!(&e, ControlError::Forbidden { reason: m } if m.contains("one trust domain")),
            "{e:?}"
        );
        r.disconnect(a, t);
        r.alloc_range(b, t, &NONE).unwrap();
    }

    /// A member of an earlier run takes its orphaned slot back with what it holds; nobody
    /// takes a slot another client owns, and a second uid is kept out in kernel-demux mode.
    #[test]
    fn a_member_of_an_earlier_run_is_adopted_into_its_slot() {
        let mut r = Registry::new(policy(1 << 22)); // client slots 1..=3
        let t = Instant::now();
        let a = device(&mut r, 1, 0, t);
        let occupied = |s: u32| s == 1;
        assert_eq!(r.alloc_range(a, t, &occupied).unwrap().slot, 2);
        let old = device(&mut r, 2, 0, t);
        let held = Objects {
            qps: 3,
            ..Objects::default()
        };
        assert!(matches!(
            r.adopt(old, 2, held),
            Err(ControlError::Forbidden { .. })
        ));
        let lease = r.adopt(old, 1, held).unwrap();
        assert_eq!((lease.slot, lease.qpn_base), (1, 1 << 22));
        assert!(r.orphans().is_empty());
        assert!(matches!(
            r.adopt(old, 3, held),
            Err(ControlError::AlreadyHasRange { slot: 1 })
        ));
        let other_uid = device(&mut r, 3, 1000, t);
        assert!(matches!(
            r.adopt(other_uid, 3, held),
            Err(ControlError::Forbidden { .. })
        ));
        // Its objects count again: gone with it.
        assert_eq!(r.disconnect(old, t).unwrap().objects.qps, 3);
    }

    /// A slot a member of an earlier daemon run still holds is skipped, becomes an orphan,
    /// and after its member goes waits out the quarantine.
    #[test]
    fn occupied_slots_become_orphans_until_their_member_goes() {
        let mut r = Registry::new(policy(1 << 22)); // client slots 1..=3
        let t = Instant::now();
        let a = device(&mut r, 1, 0, t);
        let occupied = |s: u32| s == 1 || s == 2;
        assert_eq!(r.alloc_range(a, t, &occupied).unwrap().slot, 3);
        assert_eq!(r.orphans(), [1, 2]);
        let b = device(&mut r, 2, 0, t);
        assert!(matches!(
            r.alloc_range(b, t, &NONE),
            Err(ControlError::NoFreeRange { .. })
        ));
        r.orphan_gone(1, t);
        assert_eq!(r.orphans(), [2]);
        assert_eq!(r.stats(t).slots_quarantined, 1);
        let later = t + Duration::from_millis(100);
        assert_eq!(r.alloc_range(b, later, &NONE).unwrap().slot, 1);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Connect,
        Alloc(usize),
        Drop(usize),
        Advance(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            Just(Op::Connect),
            (0..16usize).prop_map(Op::Alloc),
            (0..16usize).prop_map(Op::Drop),
            (0..80u64).prop_map(Op::Advance),
        ]
    }

    proptest! {
        /// Over any sequence of connects, allocations, deaths and time: no two live leases
        /// overlap, none covers slot 0, and a slot is never handed out while a client that
        /// held it died less than the quarantine ago.
        #[test]
        fn ranges_never_overlap_and_respect_the_quarantine(ops in prop::collection::vec(op(), 1..200)) {
            let mut r = Registry::new(policy(1 << 21)); // 8 slots
            let mut now = Instant::now();
            let mut conns: Vec<ClientId> = Vec::new();
            let mut live: HashMap<ClientId, Lease> = HashMap::new();
            let mut died: HashMap<u32, Instant> = HashMap::new();
            let mut next = 0;
            for o in ops {
                match o {
                    Op::Connect => {
                        next += 1;
                        conns.push(device(&mut r, next, 0, now));
                    }
                    Op::Alloc(i) if !conns.is_empty() => {
                        let id = conns[i % conns.len()];
                        if let Ok(l) = r.alloc_range(id, now, &NONE) {
                            prop_assert!(l.slot != 0);
                            if let Some(&d) = died.get(&l.slot) {
                                prop_assert!(now >= d + Duration::from_millis(100));
                            }
                            for other in live.values() {
                                let (a0, a1) = (l.qpn_base, l.qpn_base + l.qpn_count);
                                let (b0, b1) = (other.qpn_base, other.qpn_base + other.qpn_count);
                                prop_assert!(a1 <= b0 || b1 <= a0, "{l:?} overlaps {other:?}");
                            }
                            live.insert(id, l);
                        }
                    }
                    Op::Drop(i) if !conns.is_empty() => {
                        let id = conns.remove(i % conns.len());
                        if let Some(rp) = r.disconnect(id, now) {
                            died.insert(rp.slot, now);
                        }
                        live.remove(&id);
                    }
                    Op::Advance(ms) => now += Duration::from_millis(ms),
                    _ => {}
                }
            }
        }
    }
}
