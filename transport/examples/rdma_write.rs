//! One RDMA WRITE between two processes over real UDP sockets, with the out-of-band exchange
//! done over TCP by shipping each side's serialised [`RemoteQp`] (one JSON line each way).
//!
//! Two terminals on one host (two loopback addresses; any two hosts work the same way):
//!
//! ```text
//! cargo run --release -p roce-transport --example rdma_write -- server 127.0.0.1 18600
//! cargo run --release -p roce-transport --example rdma_write -- client 127.0.0.2 127.0.0.1:18600
//! ```
//!
//! Or both roles in one process, each on its own device (no arguments): `... --example
//! rdma_write`. UDP port 4791 of each address must be free (a kernel rdma_rxe device or
//! another rocectl holds it otherwise).
//!
//! The server registers a buffer the peer may write, sends `{qp, addr, rkey, len}`, reads the
//! client's `RemoteQp`, connects and waits for the client's `done`. The client reads the
//! server's record, sends its own `RemoteQp`, connects, RDMA WRITEs its message into the
//! server's buffer, waits for the completion and says `done`. Every wait is bounded.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use roce_transport::{
    Access, Completion, ConnectOptions, Device, DeviceConfig, Psn, QpInit, QpType, QueuePair, RKey,
    RemoteQp, SendOp, SendWr, WcStatus,
};

type Error = Box<dyn std::error::Error + Send + Sync>;

const MESSAGE: &[u8] = b"hello from the client, by RDMA WRITE";
const TIMEOUT: Duration = Duration::from_secs(30);

/// What the server tells the client: where to connect and where to write.
#[derive(serde::Serialize, serde::Deserialize)]
struct ServerRecord {
    qp: RemoteQp,
    addr: u64,
    rkey: u32,
    len: usize,
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["server", ip, port] => server(ip.parse()?, port.parse()?, |_| {}),
        ["client", ip, server_addr] => client(ip.parse()?, server_addr.parse()?),
        [] => {
            let (tx, rx) = std::sync::mpsc::channel();
            let s = std::thread::spawn(move || {
                server("127.0.0.1".parse()?, 0, move |port| {
                    let _ = tx.send(port);
                })
            });
            let port = rx.recv_timeout(TIMEOUT)?;
            client(
                "127.0.0.2".parse()?,
                SocketAddr::new("127.0.0.1".parse()?, port),
            )?;
            s.join().map_err(|_| "the server thread panicked")?
        }
        _ => Err("usage: rdma_write [server LOCAL_IP PORT | client LOCAL_IP SERVER:PORT]".into()),
    }
}

/// A device on `ip` (UDP 4791), a CQ and an RC QP.
fn open(
    ip: IpAddr,
) -> Result<
    (
        Device,
        roce_transport::ProtectionDomain,
        roce_transport::CompletionQueue,
        QueuePair,
    ),
    Error,
> {
    let dev = Device::open(DeviceConfig::udp(ip))?;
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(16)?;
    let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq))?;
    Ok((dev, pd, cq, qp))
}

fn send_line(stream: &mut TcpStream, value: &impl serde::Serialize) -> Result<(), Error> {
    let mut line = serde_json::to_vec(value)?;
    line.push(b'\n');
    stream.write_all(&line)?;
    Ok(())
}

fn read_line<T: serde::de::DeserializeOwned>(reader: &mut impl BufRead) -> Result<T, Error> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err("the peer closed the out-of-band connection".into());
    }
    Ok(serde_json::from_str(&line)?)
}

fn server(ip: IpAddr, port: u16, listening: impl FnOnce(u16)) -> Result<(), Error> {
    let (dev, pd, _cq, qp) = open(ip)?;
    let buf = pd.register(vec![0u8; 4096], Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    let psn = Psn::new(dev.random_psn());

    let listener = TcpListener::bind(SocketAddr::new(ip, port))?;
    listening(listener.local_addr()?.port());
    println!(
        "server: device on {ip}, waiting for a client on {}",
        listener.local_addr()?
    );
    let (mut stream, peer) = listener.accept()?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    let record = ServerRecord {
        qp: qp.endpoint(psn),
        addr: buf.addr(),
        rkey: buf.rkey().value(),
        len: buf.len(),
    };
    send_line(&mut stream, &record)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let remote: RemoteQp = read_line(&mut reader)?;
    println!("server: client {peer} is QP {remote}");
    qp.connect(
        &remote,
        &ConnectOptions {
            local_psn: psn,
            ..ConnectOptions::default()
        },
    )?;
    send_line(&mut stream, &"connected")?;

    // The client's WRITE lands without any completion here: its `done` says it finished.
    let done: String = read_line(&mut reader)?;
    if done != "done" {
        return Err(format!("unexpected message {done:?}").into());
    }
    let data = buf.to_vec();
    println!(
        "server: buffer now holds {:?}",
        String::from_utf8_lossy(&data[..MESSAGE.len()])
    );
    if &data[..MESSAGE.len()] != MESSAGE {
        return Err("the buffer does not hold the client's message".into());
    }
    Ok(())
}

fn client(ip: IpAddr, server_addr: SocketAddr) -> Result<(), Error> {
    let (dev, pd, cq, qp) = open(ip)?;
    let psn = Psn::new(dev.random_psn());
    let mut stream = TcpStream::connect_timeout(&server_addr, TIMEOUT)?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let record: ServerRecord = read_line(&mut reader)?;
    send_line(&mut stream, &qp.endpoint(psn))?;
    qp.connect(
        &record.qp,
        &ConnectOptions {
            local_psn: psn,
            ..ConnectOptions::default()
        },
    )?;
    // Wait until the server's QP is ready to receive too, then write.
    let _: String = read_line(&mut reader)?;
    if record.len < MESSAGE.len() {
        return Err("the server's buffer is too small".into());
    }

    let src = pd.register(MESSAGE.to_vec(), Access::LOCAL_WRITE)?;
    let op = SendOp::RdmaWrite {
        remote_addr: record.addr,
        rkey: RKey::new(record.rkey),
    };
    qp.post_send(SendWr::new(1, op, vec![src.sge(0, MESSAGE.len())]))?;
    let mut wc = [Completion::EMPTY; 1];
    if cq.wait(&mut wc, TIMEOUT) == 0 {
        return Err("no completion within 30 s".into());
    }
    // `{:#}` prints the status as the stock tools do: `remote access error (10)`.
    println!(
        "client: RDMA WRITE of {} bytes to {}: {:#}",
        MESSAGE.len(),
        record.qp.gid,
        wc[0].status
    );
    if wc[0].status != WcStatus::Success {
        return Err(format!("the WRITE failed: {}", wc[0].status).into());
    }
    send_line(&mut stream, &"done")?;
    Ok(())
}
