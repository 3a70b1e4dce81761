//! Two `udp` devices on loopback (127.0.0.1 and 127.0.0.2, port 4791, no privileges): every
//! RC operation and UD SEND from 0 bytes to 1 MiB with the data checked, the capture verified
//! by `shared/tools/check_pcap.sh`, and the errors users meet (address in use, unreachable
//! peer, MTU too large).
//!
//! The tests in this file share 127.0.0.1:4791 and 127.0.0.2:4791, so they take a lock.

mod pcap_check;

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use roce_transport::selftest::{run_rc, run_ud, SelftestOptions};
use roce_transport::{
    Access, Completion, ConnectOptions, Device, DeviceConfig, Mtu, OpenError, Psn, QpInit, QpType,
    Qpn, RemoteQp, SendOp, SendWr, WcStatus,
};

use pcap_check::check_pcap;

static PORTS: Mutex<()> = Mutex::new(());

fn open(ip: &str, name: &str, pcap: Option<&PathBuf>) -> Device {
    let mut cfg = DeviceConfig::udp(ip.parse().unwrap()).name(name);
    if let Some(p) = pcap {
        cfg = cfg.pcap(p);
    }
    Device::open(cfg).unwrap_or_else(|e| panic!("open {ip}: {e}"))
}

#[test]
fn every_operation_over_loopback_udp_with_a_verified_capture() {
    let _g = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = std::env::temp_dir().join(format!("roce-loopback-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pa = dir.join("a.pcap");
    let pb = dir.join("b.pcap");
    {
        let a = open("127.0.0.1", "lo-a", Some(&pa));
        let b = open("127.0.0.2", "lo-b", Some(&pb));
        assert_eq!(a.query_device().backend, "udp");
        let opts = SelftestOptions {
            sizes: vec![0, 1, 1000, 4096, 4097, 65_536, 1 << 20],
            iterations: 2,
            ud_sizes: vec![0, 1, 1024, 4096],
            ..SelftestOptions::default()
        };
        run_rc(&a, &b, &opts, &mut |r| eprintln!("{r}")).unwrap_or_else(|e| panic!("{e}"));
        run_ud(&a, &b, &opts, &mut |r| eprintln!("{r}")).unwrap_or_else(|e| panic!("{e}"));
        let (ca, cb) = (a.counters(), b.counters());
        eprintln!("a: {ca:?}\nb: {cb:?}");
        assert_eq!(ca.icrc_errors + cb.icrc_errors, 0);
        assert!(ca.rcvd_pkts > 0 && cb.rcvd_pkts > 0);
        a.flush_capture().unwrap();
        b.flush_capture().unwrap();
    }
    check_pcap(&pa);
    check_pcap(&pb);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_second_device_on_the_same_address_is_refused_clearly() {
    let _g = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    let _a = open("127.0.0.1", "first", None);
    let err = Device::open(DeviceConfig::udp("127.0.0.1".parse().unwrap())).unwrap_err();
    assert!(matches!(err, OpenError::AddrInUse { .. }), "{err:?}");
    assert!(err.to_string().contains("127.0.0.1:4791"), "{err}");
}

#[test]
fn an_address_not_on_this_host_is_refused_clearly() {
    let err = Device::open(DeviceConfig::udp("192.0.2.123".parse().unwrap())).unwrap_err();
    assert!(matches!(err, OpenError::AddrNotAvailable { .. }), "{err:?}");
}

#[test]
fn a_path_mtu_beyond_the_device_is_refused() {
    let _g = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    let a =
        Device::open(DeviceConfig::udp("127.0.0.1".parse().unwrap()).mtu(Mtu::Mtu1024)).unwrap();
    let pd = a.alloc_pd();
    let cq = a.create_cq(4).unwrap();
    let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq)).unwrap();
    let remote = RemoteQp {
        qpn: Qpn::new(0x11),
        psn: Psn::new(0),
        gid: a.local_gid(),
    };
    let opts = ConnectOptions {
        mtu: Some(Mtu::Mtu4096),
        ..ConnectOptions::default()
    };
    let err = qp.connect(&remote, &opts).unwrap_err();
    assert!(err.to_string().contains("4096"), "{err}");
}

#[test]
fn an_unreachable_peer_ends_in_a_retry_exceeded_completion() {
    let _g = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    let a = open("127.0.0.1", "lonely", None);
    let pd = a.alloc_pd();
    let cq = a.create_cq(4).unwrap();
    let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq)).unwrap();
    // Nobody listens on 127.0.0.9.
    let remote = RemoteQp {
        qpn: Qpn::new(0x11),
        psn: Psn::new(0),
        gid: roce_transport::Gid::from_ip("127.0.0.9".parse().unwrap()),
    };
    let opts = ConnectOptions {
        timeout: 8, // ~1 ms
        retry_cnt: 2,
        ..ConnectOptions::default()
    };
    qp.connect(&remote, &opts).unwrap();
    let mr = pd.register(vec![1u8; 16], Access::LOCAL_WRITE).unwrap();
    qp.post_send(SendWr::new(5, SendOp::Send, vec![mr.sge(0, 16)]))
        .unwrap();
    let mut wc = [Completion::EMPTY];
    assert_eq!(cq.wait(&mut wc, Duration::from_secs(10)), 1);
    assert_eq!(wc[0].wr_id, 5);
    assert_eq!(wc[0].status, WcStatus::RetryExcErr);
    assert!(a.counters().ack_timeouts >= 3);
}

#[test]
fn the_gid_table_mirrors_rxe_on_lo() {
    let _g = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    let a = open("127.0.0.1", "gids", None);
    let table = a.gid_table();
    // rxe on lo: fe80::200:ff:fe00:0 (the zero MAC's EUI-64), then ::ffff:127.0.0.1.
    assert_eq!(
        table[0].gid.to_ip(),
        "fe80::200:ff:fe00:0".parse::<std::net::IpAddr>().unwrap()
    );
    assert_eq!(a.local_gid_index(), Some(1));
    assert_eq!(a.gid(1).unwrap(), a.local_gid());
    assert_eq!(a.query_port().netdev.as_deref(), Some("lo"));
    let err = a.gid(200).unwrap_err();
    assert!(err.to_string().contains("GID index 200"), "{err}");
}
