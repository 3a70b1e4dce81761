//! Address handles (`ibv_create_ah`, `ibv_create_ah_from_wc`, `ibv_init_ah_from_wc`,
//! `ibv_destroy_ah`). OWNER: helper "qp".
//!
//! On RoCE an address vector is a GRH: `ah_attr.is_global` must be set (rdma-core and the
//! kernel refuse a LID-only address on an Ethernet port with `EINVAL`), `grh.dgid` is the
//! peer's IP address as a GID, and `grh.sgid_index` must name the GID of the one address the
//! device's engine is bound to ([`roce_transport::Device::local_gid_index`]): the engine has
//! no other source address to send from.
//!
//! `ibv_init_ah_from_wc` follows rdma-core's `libibverbs/verbs.c` for RoCE v2: the 40-byte
//! area at the start of a UD receive buffer holds an IPv6 header, or an IPv4 header in its
//! last 20 bytes (the first 20 zero), as rdma_rxe writes it and as rocectl's UD receive
//! writes it (`roce_qp::ud`, `transport/src/endpoint.rs`). Which of the two it is comes from
//! rdma-core's `get_grh_header_version` test: the IPv6 version nibble, else the IPv4 version,
//! and the IPv4 header checksum when both could be true.

use std::cell::UnsafeCell;
use std::ffi::c_int;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};

use roce_transport::{AddressHandle, Device, Gid};

use crate::context::ContextRec;
use crate::ffi::{guard_int, guard_ptr, trace};
use crate::pd::PdRec;
use crate::sys::{
    ibv_ah, ibv_ah_attr, ibv_context, ibv_grh, ibv_pd, ibv_wc, ibv_wc_flags_IBV_WC_GRH,
};

/// The only port of a rocectl device.
const PORT: u8 = 1;
/// IPv6 next header of a RoCE v2 packet (UDP).
const IPPROTO_UDP: u8 = 17;

/// An address handle: where a UD send goes.
#[repr(C)]
pub(crate) struct AhRec {
    /// Must stay the first field (`UnsafeCell` has the layout of `ibv_ah`; C may write the
    /// public struct while we hold a reference to the record).
    pub(crate) ibv: UnsafeCell<ibv_ah>,
    /// The address vector.
    pub(crate) ah: AddressHandle,
}

impl AhRec {
    /// The record behind an `ibv_ah` of this library; `None` for NULL.
    ///
    /// # Safety
    /// `ah` is NULL or a live AH from [`ibv_create_ah`].
    pub(crate) unsafe fn from_ibv<'a>(ah: *mut ibv_ah) -> Option<&'a Self> {
        // SAFETY: the `ibv_ah` is the first field of the `#[repr(C)]` record.
        unsafe { ah.cast::<Self>().as_ref() }
    }
}

/// The address vector of an `ibv_ah_attr` on `dev`, checked as rxe and the kernel check a
/// RoCE address: a GRH, port 1, a destination GID of the device's address family, and the
/// source GID index of the device's own address. `verb` names the caller in the trace line a
/// refusal logs (`ROCECTL_VERBS_TRACE`).
///
/// # Errors
/// `EINVAL` for any of the above.
pub(crate) fn address_handle(
    dev: &Device,
    a: &ibv_ah_attr,
    verb: &str,
) -> Result<AddressHandle, i32> {
    if a.is_global == 0 {
        trace(format_args!(
            "{verb}: RoCE needs a GRH (ah_attr.is_global = 1 with the peer's GID; \
             the pingpongs' -g, perftest's -x)"
        ));
        return Err(libc::EINVAL);
    }
    if a.port_num != PORT {
        trace(format_args!(
            "{verb}: port {} does not exist (port 1 only)",
            a.port_num
        ));
        return Err(libc::EINVAL);
    }
    // SAFETY: every bit pattern is a valid `[u8; 16]`.
    let dgid = Gid(unsafe { a.grh.dgid.raw });
    let local = dev.local_gid();
    if dgid == Gid::ZERO || dgid.is_ipv4_mapped() != local.is_ipv4_mapped() {
        trace(format_args!(
            "{verb}: destination GID {dgid} is not an address the device at {} can reach",
            local.to_ip()
        ));
        return Err(libc::EINVAL);
    }
    let index = dev.local_gid_index();
    if index != Some(a.grh.sgid_index) {
        trace(format_args!(
            "{verb}: sgid_index {} is not the GID of the device's address {} (index {})",
            a.grh.sgid_index,
            local.to_ip(),
            index.map_or_else(|| "none".to_owned(), |i| i.to_string()),
        ));
        return Err(libc::EINVAL);
    }
    Ok(AddressHandle {
        dgid,
        sgid_index: a.grh.sgid_index,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        flow_label: a.grh.flow_label & 0x000F_FFFF,
    })
}

/// The `ibv_ah_attr` of an address vector (for `ibv_query_qp`).
pub(crate) fn ah_attr_of(ah: &AddressHandle) -> ibv_ah_attr {
    let mut a = ibv_ah_attr::default();
    a.grh.dgid.raw = ah.dgid.0;
    a.grh.flow_label = ah.flow_label;
    a.grh.sgid_index = ah.sgid_index;
    a.grh.hop_limit = ah.hop_limit;
    a.grh.traffic_class = ah.traffic_class;
    a.is_global = 1;
    a.port_num = PORT;
    a
}

/// Handles of this process's AHs (`ibv_ah.handle`), unique per process.
static NEXT_HANDLE: AtomicU32 = AtomicU32::new(1);

/// `ibv_create_ah(3)`: an address handle for UD sends. RoCE: `is_global` must be set and
/// `grh.sgid_index` must be the device's own GID.
///
/// # Safety
/// `pd` is NULL or a live PD of this library; `attr` is NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    guard_ptr("ibv_create_ah", || {
        // SAFETY: per the contract.
        let pd_rec = unsafe { PdRec::from_ibv(pd) }.ok_or(libc::EINVAL)?;
        // SAFETY: per the contract.
        let attr = unsafe { attr.as_ref() }.ok_or(libc::EINVAL)?;
        let ctx = pd_rec.ibv.context;
        // SAFETY: a PD's context is the live context it was allocated on.
        let ctx_rec = unsafe { ContextRec::from_ibv(ctx) }.ok_or(libc::EINVAL)?;
        let ah = address_handle(&ctx_rec.dev, attr, "ibv_create_ah")?;
        let rec = Box::new(AhRec {
            ibv: UnsafeCell::new(ibv_ah {
                context: ctx,
                pd,
                handle: NEXT_HANDLE.fetch_add(1, Ordering::Relaxed),
            }),
            ah,
        });
        // The PD cannot be deallocated while the AH uses it (EBUSY).
        pd_rec.hold();
        Ok(Box::into_raw(rec).cast::<ibv_ah>())
    })
}

/// `ibv_destroy_ah(3)`.
///
/// # Safety
/// `ah` is NULL or a live AH of this library, not used by a send still being posted.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    guard_int("ibv_destroy_ah", || {
        if ah.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: per the contract, `ah` came from `Box::into_raw` in `ibv_create_ah`. A UD
        // send copies the address vector when it is posted, so nothing refers to it.
        let rec = unsafe { Box::from_raw(ah.cast::<AhRec>()) };
        // SAFETY: the AH's PD is live: it was held since the AH was created.
        if let Some(pd) = unsafe { PdRec::from_ibv((*rec.ibv.get()).pd) } {
            pd.release();
        }
        drop(rec);
        Ok(())
    })
}

/// `ibv_init_ah_from_wc(3)`: the address attributes that answer the sender of a UD receive
/// (`wc`) whose buffer started with the 40-byte GRH area `grh`. Returns 0, or -1 with `errno`
/// (rdma-core's convention for this function).
///
/// # Safety
/// `ctx` is a live context of this library; `wc`, `grh` (40 bytes) and `ah_attr` are valid.
#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    ctx: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    let r = guard_int("ibv_init_ah_from_wc", || {
        // SAFETY: per the contract.
        let ctx_rec = unsafe { ContextRec::from_ibv(ctx) }.ok_or(libc::EINVAL)?;
        // SAFETY: per the contract.
        let (wc, out) = unsafe { (wc.as_ref(), ah_attr.as_mut()) };
        let (Some(wc), Some(out)) = (wc, out) else {
            return Err(libc::EINVAL);
        };
        if grh.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: per the contract, `grh` points to the 40 bytes at the start of the receive
        // buffer; read them as bytes (any alignment).
        let area = unsafe { std::ptr::read_unaligned(grh.cast::<[u8; 40]>()) };
        *out = init_ah_attr(&ctx_rec.dev, port_num, wc, &area)?;
        Ok(())
    });
    if r == 0 {
        0
    } else {
        -1
    }
}

/// `ibv_create_ah_from_wc(3)`: [`ibv_init_ah_from_wc`] then [`ibv_create_ah`].
///
/// # Safety
/// As [`ibv_init_ah_from_wc`], with `pd` a live PD of this library.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port_num: u8,
) -> *mut ibv_ah {
    guard_ptr("ibv_create_ah_from_wc", || {
        // SAFETY: per the contract.
        let pd_rec = unsafe { PdRec::from_ibv(pd) }.ok_or(libc::EINVAL)?;
        let mut attr = ibv_ah_attr::default();
        // SAFETY: per the contract; `attr` is a local.
        if unsafe { ibv_init_ah_from_wc(pd_rec.ibv.context, port_num, wc, grh, &mut attr) } != 0 {
            return Err(last_errno());
        }
        // SAFETY: per the contract; `attr` is a local.
        let ah = unsafe { ibv_create_ah(pd, &mut attr) };
        if ah.is_null() {
            Err(last_errno())
        } else {
            Ok(ah)
        }
    })
}

/// The calling thread's `errno` (what a verb that failed just set).
pub(crate) fn last_errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// rdma-core's `ibv_init_ah_from_wc` over the bytes of the GRH area.
fn init_ah_attr(
    dev: &Device,
    port_num: u8,
    wc: &ibv_wc,
    area: &[u8; 40],
) -> Result<ibv_ah_attr, i32> {
    let mut a = ibv_ah_attr::default();
    // set_ah_attr_generic_fields: the flow label of the IPv6 word (zero for IPv4).
    let word0 = u32::from_be_bytes([area[0], area[1], area[2], area[3]]);
    a.grh.flow_label = word0 & 0x000F_FFFF;
    a.dlid = wc.slid;
    a.sl = wc.sl;
    a.src_path_bits = wc.dlid_path_bits;
    a.port_num = port_num;
    if wc.wc_flags & ibv_wc_flags_IBV_WC_GRH == 0 {
        return Ok(a);
    }
    a.is_global = 1;
    let (src, dst, hop_limit, traffic_class) = match grh_version(area) {
        Some(4) => {
            let ip = &area[20..];
            let dst = IpAddr::from([ip[16], ip[17], ip[18], ip[19]]);
            if dst.is_multicast() {
                return Err(libc::EINVAL);
            }
            let src = IpAddr::from([ip[12], ip[13], ip[14], ip[15]]);
            (src, dst, ip[8], ip[1])
        }
        Some(_) => {
            let mut s = [0u8; 16];
            let mut d = [0u8; 16];
            s.copy_from_slice(&area[8..24]);
            d.copy_from_slice(&area[24..40]);
            if d[0] == 0xFF {
                return Err(libc::EINVAL);
            }
            // Next header 0x1b is RoCE v1, whose GIDs this device does not have.
            if area[6] != IPPROTO_UDP {
                return Err(libc::EPROTONOSUPPORT);
            }
            let tclass = ((word0 >> 20) & 0xFF) as u8;
            (Gid(s).to_ip(), Gid(d).to_ip(), area[7], tclass)
        }
        None => return Err(libc::EPROTONOSUPPORT),
    };
    // ibv_find_gid_index: the index of the GID the packet was sent to, on this port.
    let dgid = Gid::from_ip(dst);
    let index = if port_num == PORT {
        dev.gid_table()
            .iter()
            .find(|e| e.gid == dgid)
            .map(|e| e.index)
    } else {
        None
    };
    let Some(index) = index else {
        trace(format_args!(
            "ibv_init_ah_from_wc: {dst} (the packet's destination) is not in port {port_num}'s GID table"
        ));
        return Err(libc::EINVAL);
    };
    a.grh.dgid.raw = Gid::from_ip(src).0;
    a.grh.sgid_index = index;
    a.grh.hop_limit = hop_limit;
    a.grh.traffic_class = traffic_class;
    Ok(a)
}

/// rdma-core's `get_grh_header_version`: 4 or 6, `None` if neither.
fn grh_version(area: &[u8; 40]) -> Option<u8> {
    let ip4 = &area[20..];
    if area[0] >> 4 != 6 {
        return (ip4[0] >> 4 == 4).then_some(4);
    }
    // An IPv6 header whose bytes 20.. also look like an IPv4 header of 5 words: the IPv4
    // checksum decides.
    if ip4[0] & 0x0F != 5 {
        return Some(6);
    }
    let stored = [ip4[10], ip4[11]];
    let mut sum: u32 = 0;
    for (i, pair) in ip4[..20].chunks_exact(2).enumerate() {
        if i != 5 {
            sum += u32::from(u16::from_ne_bytes([pair[0], pair[1]]));
        }
    }
    // rdma-core folds once.
    sum = (sum & 0xFFFF) + (sum >> 16);
    let check = !(sum as u16);
    Some(if check.to_ne_bytes() == stored { 4 } else { 6 })
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::qp::harness::{connected, ibv_sge_of, post, post_recv_one, WC_GRH, WC_SUCCESS};
    use crate::qp::{SEND_SIGNALED, WR_SEND};
    use crate::sys::{ibv_qp_type_IBV_QPT_UD, ibv_send_wr};

    /// A UD SEND from `qp` to `ah`/`dqpn` of `len` bytes at `addr`/`lkey`.
    fn ud_send(ah: *mut ibv_ah, dqpn: u32, s: roce_transport::Sge) -> ibv_send_wr {
        let mut w = ibv_send_wr {
            wr_id: 77,
            num_sge: 1,
            opcode: WR_SEND,
            send_flags: SEND_SIGNALED,
            ..ibv_send_wr::default()
        };
        let sg = Box::leak(Box::new(ibv_sge_of(s)));
        w.sg_list = sg;
        w.wr.ud.ah = ah;
        w.wr.ud.remote_qpn = dqpn;
        w.wr.ud.remote_qkey = 0x1111_1111;
        w
    }

    #[test]
    fn ud_send_then_reply_through_create_ah_from_wc() {
        let (a, b, qa, qb) = connected(ibv_qp_type_IBV_QPT_UD);
        // SAFETY: live QPs of the test.
        let (na, nb) = unsafe { ((*qa).qp_num, (*qb).qp_num) };
        let rbuf = b.mr(40 + 64, 0xEE);
        assert_eq!(post_recv_one(qb, 5, rbuf.sge(0, 40 + 64)), 0);

        let mut attr = a.ah_attr_to(&b);
        // SAFETY: the harness's PD and a local attribute struct.
        let ah = unsafe { ibv_create_ah(a.pd, &mut attr) };
        assert!(!ah.is_null());
        let msg = a.mr(11, 0);
        msg.write(0, b"ud datagram").unwrap();
        let mut w = ud_send(ah, nb, msg.sge(0, 11));
        assert_eq!(post(qa, &mut w).0, 0);
        assert_eq!(a.poll(1)[0].status, WC_SUCCESS);
        let c = b.poll(1);
        assert_eq!((c[0].wr_id, c[0].byte_len, c[0].src_qp), (5, 40 + 11, na));
        assert_ne!(c[0].wc_flags & WC_GRH, 0, "poll_cq reports the GRH area");
        let bytes = rbuf.to_vec();
        assert_eq!(&bytes[40..51], b"ud datagram");
        // rxe's layout for IPv4: 20 zero bytes, then the IPv4 header.
        assert_eq!(bytes[..20], [0u8; 20]);
        assert_eq!(bytes[20] >> 4, 4);

        // The AH back to the sender, from the work completion poll_cq reported.
        let mut wc = c[0];
        let mut grh = [0u8; 40];
        grh.copy_from_slice(&bytes[..40]);
        let mut back = ibv_ah_attr::default();
        // SAFETY: live context, local structs; the GRH area is 40 bytes.
        let r =
            unsafe { ibv_init_ah_from_wc(b.ctx, 1, &mut wc, grh.as_mut_ptr().cast(), &mut back) };
        assert_eq!(r, 0);
        assert_eq!(back.is_global, 1);
        // SAFETY: reading a plain union member.
        assert_eq!(unsafe { back.grh.dgid.raw }, a.dev.local_gid().0);
        assert_eq!(back.grh.sgid_index, b.dev.local_gid_index().unwrap());
        assert_eq!(back.port_num, 1);

        // SAFETY: as above, with the harness's PD.
        let reply_ah = unsafe { ibv_create_ah_from_wc(b.pd, &mut wc, grh.as_mut_ptr().cast(), 1) };
        assert!(!reply_ah.is_null());
        let abuf = a.mr(40 + 64, 0);
        assert_eq!(post_recv_one(qa, 6, abuf.sge(0, 40 + 64)), 0);
        let reply = b.mr(5, 0);
        reply.write(0, b"reply").unwrap();
        let mut w = ud_send(reply_ah, wc.src_qp, reply.sge(0, 5));
        assert_eq!(post(qb, &mut w).0, 0);
        let c = a.poll(1);
        assert_eq!((c[0].wr_id, c[0].src_qp), (6, nb));
        assert_eq!(&abuf.to_vec()[40..45], b"reply");

        // Port 2 and a missing GRH flag: no global address, or -1 for an absent port.
        wc.wc_flags = 0;
        // SAFETY: as above.
        assert_eq!(
            unsafe { ibv_init_ah_from_wc(b.ctx, 1, &mut wc, grh.as_mut_ptr().cast(), &mut back) },
            0
        );
        assert_eq!(back.is_global, 0);
        wc.wc_flags = ibv_wc_flags_IBV_WC_GRH;
        // SAFETY: as above.
        assert_eq!(
            unsafe { ibv_init_ah_from_wc(b.ctx, 2, &mut wc, grh.as_mut_ptr().cast(), &mut back) },
            -1
        );

        // SAFETY: the test's AHs.
        unsafe {
            assert_eq!(ibv_destroy_ah(ah), 0);
            assert_eq!(ibv_destroy_ah(reply_ah), 0);
        }
    }

    /// UCX 1.13's UD interface frees its receive pool (still registered, through its
    /// registration cache) before it destroys the QP; a datagram arriving in between must fail
    /// its receive, not kill the process (a NIC would have written the pinned pages).
    #[test]
    fn a_datagram_into_memory_unmapped_while_registered_fails_the_receive_only() {
        use crate::sys::ibv_wc_status_IBV_WC_LOC_PROT_ERR as WC_LOC_PROT_ERR;
        let (a, b, qa, qb) = connected(ibv_qp_type_IBV_QPT_UD);
        // SAFETY: a live QP of the test.
        let nb = unsafe { (*qb).qp_num };
        const LEN: usize = 8192;
        let p = crate::qp::harness::map_anonymous(LEN);
        let lw = crate::sys::ibv_access_flags_IBV_ACCESS_LOCAL_WRITE as c_int;
        // SAFETY: the harness's PD over the test's mapping.
        let mr = unsafe { crate::mr::ibv_reg_mr(b.pd, p, LEN, lw) };
        assert!(!mr.is_null());
        // SAFETY: a live MR.
        let lkey = unsafe { (*mr).lkey };
        let posted = roce_transport::Sge {
            addr: p as u64 + 4096,
            length: 4096,
            lkey: roce_transport::LKey::new(lkey),
        };
        assert_eq!(post_recv_one(qb, 9, posted), 0);
        // The second page is the posted buffer; only the library refers to it.
        crate::qp::harness::revoke(p.cast::<u8>().wrapping_add(4096).cast(), 4096);
        let before = roce_transport::unmapped_accesses();

        let mut attr = a.ah_attr_to(&b);
        // SAFETY: the harness's PD and a local attribute struct.
        let ah = unsafe { ibv_create_ah(a.pd, &mut attr) };
        assert!(!ah.is_null());
        let msg = a.mr(100, 0x3C);
        let mut w = ud_send(ah, nb, msg.sge(0, 100));
        assert_eq!(post(qa, &mut w).0, 0);
        assert_eq!(a.poll(1)[0].status, WC_SUCCESS);
        let c = b.poll(1);
        assert_eq!((c[0].wr_id, c[0].status), (9, WC_LOC_PROT_ERR));
        assert!(roce_transport::unmapped_accesses() > before);

        // SAFETY: the test's AH, MR and remaining mapping.
        unsafe {
            assert_eq!(ibv_destroy_ah(ah), 0);
            assert_eq!(crate::mr::ibv_dereg_mr(mr), 0);
            assert_eq!(libc::munmap(p, LEN), 0);
        }
    }

    #[test]
    fn create_ah_needs_a_grh_and_the_devices_gid() {
        let (a, b, _qa, _qb) = connected(ibv_qp_type_IBV_QPT_UD);
        let mut attr = a.ah_attr_to(&b);
        attr.is_global = 0;
        // SAFETY: the harness's PD and a local attribute struct.
        assert!(unsafe { ibv_create_ah(a.pd, &mut attr) }.is_null());
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EINVAL)
        );
        let mut attr = a.ah_attr_to(&b);
        attr.grh.sgid_index = 0;
        assert_ne!(
            a.dev.local_gid_index(),
            Some(0),
            "index 0 is the link-local GID"
        );
        // SAFETY: as above.
        assert!(unsafe { ibv_create_ah(a.pd, &mut attr) }.is_null());
        let mut attr = a.ah_attr_to(&b);
        attr.grh.dgid.raw = Gid::from_ip("fe80::1".parse().unwrap()).0;
        // SAFETY: as above.
        assert!(
            unsafe { ibv_create_ah(a.pd, &mut attr) }.is_null(),
            "IPv6 peer from IPv4"
        );
    }

    /// An IPv4 header (20 bytes) with a correct checksum.
    fn ipv4_header(src: [u8; 4], dst: [u8; 4], ttl: u8, tos: u8) -> [u8; 20] {
        let mut h = [0u8; 20];
        h[0] = 0x45;
        h[1] = tos;
        h[2..4].copy_from_slice(&48u16.to_be_bytes());
        h[6] = 0x40;
        h[8] = ttl;
        h[9] = IPPROTO_UDP;
        h[12..16].copy_from_slice(&src);
        h[16..20].copy_from_slice(&dst);
        let mut sum: u32 = h
            .chunks_exact(2)
            .map(|p| u32::from(u16::from_be_bytes([p[0], p[1]])))
            .sum();
        while sum > 0xFFFF {
            sum = (sum & 0xFFFF) + (sum >> 16);
        }
        h[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        h
    }

    #[test]
    fn grh_version_tells_ipv4_from_ipv6() {
        let mut v4 = [0u8; 40];
        v4[20..].copy_from_slice(&ipv4_header([10, 0, 0, 2], [10, 0, 0, 1], 64, 0));
        assert_eq!(grh_version(&v4), Some(4));

        let mut v6 = [0u8; 40];
        v6[0] = 0x60;
        v6[6] = IPPROTO_UDP;
        v6[7] = 64;
        assert_eq!(grh_version(&v6), Some(6));

        // An IPv6 header whose source address bytes happen to read as an IPv4 header with a
        // wrong checksum is still IPv6.
        v6[20] = 0x45;
        assert_eq!(grh_version(&v6), Some(6));

        // An IPv4 header behind a first word that reads as IPv6 is IPv4 if its checksum holds.
        let mut both = v4;
        both[0] = 0x60;
        assert_eq!(grh_version(&both), Some(4));

        assert_eq!(grh_version(&[0u8; 40]), None);
    }
}
