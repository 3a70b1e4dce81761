//! `rocectl pcap`: RoCEv2 captures seen through our wire codec.
//!
//! - `check FILE...` walks every frame of pcap/pcapng captures (any link type
//!   [`roce_wire::pcap::parse_link`] supports). Every UDP frame to port 4791 is parsed, its ICRC
//!   verified, its transport packet parsed, and the parsed representation re-emitted and compared
//!   byte for byte with the capture (up to the end of the IP packet: an Ethernet trailer is not
//!   part of the frame). It prints per-file and overall per-opcode counts, one line per failing
//!   frame and closes with `N passed, N failed`. A file without a single RoCEv2 frame fails.
//! - `dump FILE` prints one tcpdump-style line per frame.
//!
//! Both read gzip-compressed captures (`.pcap.gz`, recognised by their magic number), and a
//! capture that ends in the middle of a record (its writer was killed) is read up to that record,
//! which is reported as `FILE: truncated last record at offset N, K bytes of M`.
//! - `sample OUT` writes [`roce_wire::samples::all`] (one frame per opcode, plus IPv6 and 802.1Q)
//!   as a pcap file that Wireshark dissects as RRoCE.
//!
//! Which frames are RoCEv2 is decided here, leniently (etherparse's lax slicer, any number of
//! VLAN tags, IP options, truncated frames): a frame whose UDP destination port is 4791 *is*
//! RoCEv2 traffic, and if the codec then refuses it, that is a failure to report, not "other".

use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use clap::Subcommand;
use etherparse::{ArpOperation, IpNumber, LaxNetSlice, LaxSlicedPacket, LinkSlice, TransportSlice};
use roce_wire::frame::ROCEV2_PORT;
use roce_wire::icrc::{self, ICRC_LEN};
use roce_wire::pcap::{
    l3_offset, linktype, parse_link, read_capture_lenient, Capture, CapturedFrame, PcapWriter,
};
use roce_wire::{samples, Caps, Check, Frame, Opcode, ParseError};

/// The `rocectl pcap` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum PcapCommand {
    /// Parse, ICRC-verify and re-emit every RoCEv2 frame; fail on any difference
    Check {
        /// Captures to check (pcap or pcapng, optionally gzip-compressed)
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Print one tcpdump-style line per frame
    Dump {
        /// Capture to print (pcap or pcapng, optionally gzip-compressed)
        file: PathBuf,
    },
    /// Write one sample frame per opcode (plus IPv6 and VLAN variants) to a pcap file
    Sample {
        /// Output file (classic pcap, Ethernet, nanosecond timestamps)
        out: PathBuf,
    },
}

/// Runs one `rocectl pcap` subcommand.
///
/// # Errors
/// A capture that cannot be opened or is not a capture (`dump`), an output file that cannot be
/// written, or a failed write to stdout. `check` reports unreadable files itself and returns a
/// failing exit code instead.
pub(crate) fn run(cmd: PcapCommand) -> Result<ExitCode> {
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let code = match cmd {
        PcapCommand::Check { files } => check(&files, &mut out)?,
        PcapCommand::Dump { file } => dump(&file, &mut out)?,
        PcapCommand::Sample { out: path } => sample(&path, &mut out)?,
    };
    out.flush()?;
    Ok(code)
}

/// The first four bytes of the capture formats [`read_capture_lenient`] reads: pcap (micro- and
/// nanosecond, either byte order) and pcapng; gzip-compressed captures start with [`GZIP`].
const MAGICS: [[u8; 4]; 5] = [
    [0xD4, 0xC3, 0xB2, 0xA1],
    [0xA1, 0xB2, 0xC3, 0xD4],
    [0x4D, 0x3C, 0xB2, 0xA1],
    [0xA1, 0xB2, 0x3C, 0x4D],
    [0x0A, 0x0D, 0x0D, 0x0A],
];

/// The first two bytes of a gzip file (`.pcap.gz`).
const GZIP: [u8; 2] = [0x1F, 0x8B];

/// Reads a whole capture, with errors that name the file and say what went wrong. A capture
/// that ends in the middle of a record (its writer was killed) gives its whole records and the
/// cut one in [`Capture::truncated`].
fn load(path: &Path) -> Result<Capture> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot open {}", path.display()))?;
    let gzip = bytes.starts_with(&GZIP);
    let known = gzip
        || bytes
            .get(..4)
            .is_some_and(|magic| MAGICS.iter().any(|m| m == magic));
    if !known {
        let gz_name = path.extension().is_some_and(|e| e == "gz");
        return Err(anyhow!(
            "{}: not a pcap or pcapng capture{} (unknown file format)",
            path.display(),
            if gz_name { ", nor gzip-compressed" } else { "" }
        ));
    }
    read_capture_lenient(&bytes[..]).map_err(|e| {
        let what = match e.kind() {
            io::ErrorKind::UnexpectedEof => "truncated capture",
            _ => "malformed capture",
        };
        let gz = if gzip { " (gzip-compressed)" } else { "" };
        anyhow!("{}: {what}{gz} ({e})", path.display())
    })
}

/// The link types [`parse_link`] can look into.
const fn link_supported(lt: u32) -> bool {
    matches!(
        lt,
        linktype::ETHERNET
            | linktype::NULL
            | linktype::LOOP
            | linktype::RAW
            | linktype::RAW_OPENBSD
            | linktype::RAW_BSDOS
            | linktype::IPV4
            | linktype::IPV6
            | linktype::LINUX_SLL
            | linktype::LINUX_SLL2
    )
}

/// What a captured frame is, as far as RoCEv2 is concerned.
enum Class<'a> {
    /// A UDP datagram to port 4791 (which may still be malformed).
    Roce,
    /// Anything else; the lax slicing (if any) serves the one-line summary.
    Other(Option<Box<LaxSlicedPacket<'a>>>),
    /// A link type we cannot look into.
    UnsupportedLink,
}

/// Classifies a frame. Lenient on purpose: truncated frames, stacked VLAN tags, IP options and
/// first IPv4 fragments are still recognised as RoCEv2 by their UDP destination port.
fn classify(cf: &CapturedFrame) -> Class<'_> {
    if !link_supported(cf.linktype) {
        return Class::UnsupportedLink;
    }
    let sliced = if cf.linktype == linktype::ETHERNET {
        LaxSlicedPacket::from_ethernet(&cf.data).ok()
    } else {
        l3_offset(cf.linktype, &cf.data)
            .and_then(|off| LaxSlicedPacket::from_ip(&cf.data[off..]).ok())
    };
    let Some(sliced) = sliced else {
        return Class::Other(None);
    };
    let first_fragment = match &sliced.net {
        Some(LaxNetSlice::Ipv4(v4)) => v4.header().fragments_offset().value() == 0,
        // The offset of an IPv6 fragment lives in an extension header; RoCEv2 never fragments,
        // so a fragment is not looked into.
        Some(LaxNetSlice::Ipv6(v6)) => !v6.payload().fragmented,
        _ => false,
    };
    let to_roce_port = sliced
        .net
        .as_ref()
        .and_then(LaxNetSlice::ip_payload_ref)
        .is_some_and(|p| {
            p.ip_number == IpNumber::UDP
                && first_fragment
                && p.payload.get(2..4) == Some(&ROCEV2_PORT.to_be_bytes()[..])
        });
    if to_roce_port {
        Class::Roce
    } else {
        Class::Other(Some(Box::new(sliced)))
    }
}

/// Why a RoCEv2 frame failed `check`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failure {
    /// The codec refused the frame or its transport packet.
    Parse(ParseError),
    /// The ICRC does not match its recomputation (both in wire byte order).
    BadIcrc {
        /// What the ICRC should be.
        expected: [u8; ICRC_LEN],
        /// What the frame carries.
        found: [u8; ICRC_LEN],
    },
    /// The re-emitted frame differs from the capture.
    Mismatch {
        /// First differing offset from the start of the captured frame.
        offset: usize,
        /// The captured byte there (`None`: the capture ends first).
        captured: Option<u8>,
        /// The emitted byte there (`None`: the emitted frame ends first).
        emitted: Option<u8>,
    },
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Parse(e) => write!(f, "parse error {}: {e}", e.name()),
            Self::BadIcrc { expected, found } => write!(
                f,
                "bad ICRC: expected {}, found {}",
                Hex(expected),
                Hex(found)
            ),
            Self::Mismatch {
                offset,
                captured,
                emitted,
            } => {
                write!(f, "re-emit mismatch at offset {offset} ({offset:#x}): ")?;
                match (captured, emitted) {
                    (Some(c), Some(e)) => write!(f, "captured {c:#04x}, emitted {e:#04x}"),
                    (None, _) => f.write_str("the captured frame is shorter"),
                    (_, None) => f.write_str("the emitted frame is shorter"),
                }
            }
        }
    }
}

/// Bytes as contiguous lowercase hex, in order.
struct Hex<'a>(&'a [u8]);

impl fmt::Display for Hex<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// Parses a frame without checking its ICRC (callers check it themselves to report both values).
fn parse_unverified(cf: &CapturedFrame) -> Result<Frame<'_>, ParseError> {
    parse_link(cf.linktype, &cf.data, &Caps { icrc: Check::None })
}

/// The expected ICRC of a parsed frame, when it differs from the one carried.
fn icrc_mismatch(frame: &Frame<'_>) -> Option<Failure> {
    let found = frame.icrc();
    match icrc::compute(frame.ip_packet) {
        Some(expected) if expected == found => None,
        Some(expected) => Some(Failure::BadIcrc { expected, found }),
        None => Some(Failure::Parse(ParseError::Truncated)),
    }
}

/// Checks one RoCEv2 frame: parse, ICRC, transport parse, exact re-emit. Returns the opcode
/// when the BTH could be located, and the verdict.
fn check_frame(cf: &CapturedFrame) -> (Option<Opcode>, Result<(), Failure>) {
    let frame = match parse_unverified(cf) {
        Ok(frame) => frame,
        Err(e) => return (None, Err(Failure::Parse(e))),
    };
    let opcode = frame.udp_payload.first().map(|&b| Opcode::from(b));
    if let Some(failure) = icrc_mismatch(&frame) {
        return (opcode, Err(failure));
    }
    let packet = match frame.packet().and_then(|p| p.check().map(|()| p)) {
        Ok(packet) => packet,
        Err(e) => return (opcode, Err(Failure::Parse(e))),
    };
    let mut emitted = vec![0u8; frame.repr.buffer_len(&packet)];
    frame.repr.emit(&packet, &mut emitted, &Caps::default());
    // Ethernet frames are compared from their first byte; other link types from the IP header.
    let start = match frame.repr.eth {
        Some(_) => 0,
        None => l3_offset(cf.linktype, &cf.data).unwrap_or(0),
    };
    let captured = cf.data.get(start..).unwrap_or_default();
    let captured = &captured[..captured.len().min(emitted.len())];
    if captured == &emitted[..] {
        return (opcode, Ok(()));
    }
    let at = captured
        .iter()
        .zip(&emitted)
        .position(|(c, e)| c != e)
        .unwrap_or(captured.len());
    let failure = Failure::Mismatch {
        offset: start + at,
        captured: captured.get(at).copied(),
        emitted: emitted.get(at).copied(),
    };
    (opcode, Err(failure))
}

/// Passed and failed frames of one opcode.
#[derive(Clone, Copy, Debug, Default)]
struct OpCount {
    /// Frames that passed.
    passed: usize,
    /// Frames that failed.
    failed: usize,
}

/// Counts over one file or over all of them.
#[derive(Clone, Debug, Default)]
struct Tally {
    /// Every frame.
    frames: usize,
    /// Frames that are not RoCEv2.
    other: usize,
    /// Frames on a link type we cannot look into.
    unsupported: usize,
    /// RoCEv2 frames that passed.
    passed: usize,
    /// RoCEv2 frames that failed.
    failed: usize,
    /// Per opcode byte (`None`: the frame failed before its BTH could be located).
    by_opcode: BTreeMap<Option<u8>, OpCount>,
}

impl Tally {
    /// Counts one RoCEv2 frame and its verdict.
    fn record(&mut self, opcode: Option<Opcode>, ok: bool) {
        let count = self.by_opcode.entry(opcode.map(u8::from)).or_default();
        if ok {
            self.passed += 1;
            count.passed += 1;
        } else {
            self.failed += 1;
            count.failed += 1;
        }
    }

    /// Adds the counts of `other` (one file) to these.
    fn merge(&mut self, other: &Self) {
        self.frames += other.frames;
        self.other += other.other;
        self.unsupported += other.unsupported;
        self.passed += other.passed;
        self.failed += other.failed;
        for (op, count) in &other.by_opcode {
            let mine = self.by_opcode.entry(*op).or_default();
            mine.passed += count.passed;
            mine.failed += count.failed;
        }
    }

    /// `N frames: N RoCEv2 (N passed, N failed), N other[, N on unsupported link types]`
    /// followed by one indented line per opcode.
    fn write(&self, out: &mut impl Write) -> io::Result<()> {
        write!(
            out,
            "{} frames: {} RoCEv2 ({} passed, {} failed), {} other",
            self.frames,
            self.passed + self.failed,
            self.passed,
            self.failed,
            self.other
        )?;
        if self.unsupported > 0 {
            write!(
                out,
                ", {} on unsupported link types (not examined)",
                self.unsupported
            )?;
        }
        writeln!(out)?;
        for (op, count) in &self.by_opcode {
            let name = match op {
                Some(code) => Opcode::from(*code).to_string(),
                None => "(no BTH)".to_owned(),
            };
            write!(out, "  {:>6}  {name}", count.passed + count.failed)?;
            if count.failed > 0 {
                write!(out, " ({} failed)", count.failed)?;
            }
            writeln!(out)?;
        }
        Ok(())
    }
}

/// `rocectl pcap check`: prints failing frames as they are found, then per-file and overall
/// counts, and closes with `N passed, N failed`. Unreadable files are reported on stderr and
/// the others still checked. The exit status fails if a frame failed, a file could not be read
/// or held no RoCEv2 frame at all, or frames were on a link type that could not be examined.
fn check(files: &[PathBuf], out: &mut impl Write) -> Result<ExitCode> {
    let mut total = Tally::default();
    let mut unreadable = 0;
    let mut empty = 0;
    for path in files {
        let Capture {
            frames, truncated, ..
        } = match load(path) {
            Ok(capture) => capture,
            Err(e) => {
                out.flush()?;
                eprintln!("rocectl: error: {e:#}");
                unreadable += 1;
                continue;
            }
        };
        let mut tally = Tally {
            frames: frames.len(),
            ..Tally::default()
        };
        let mut unsupported_links = Vec::new();
        for (i, cf) in frames.iter().enumerate() {
            match classify(cf) {
                Class::Roce => {}
                Class::Other(_) => {
                    tally.other += 1;
                    continue;
                }
                Class::UnsupportedLink => {
                    tally.unsupported += 1;
                    if !unsupported_links.contains(&cf.linktype) {
                        unsupported_links.push(cf.linktype);
                    }
                    continue;
                }
            }
            let (opcode, verdict) = check_frame(cf);
            if let Err(failure) = &verdict {
                writeln!(out, "{}: frame {}: {failure}", path.display(), i + 1)?;
            }
            tally.record(opcode, verdict.is_ok());
        }
        if let Some(t) = truncated {
            // What a writer killed mid-write leaves; the records before it are checked.
            writeln!(out, "{}: {t} (not checked)", path.display())?;
        }
        write!(out, "{}: ", path.display())?;
        tally.write(out)?;
        if !unsupported_links.is_empty() {
            out.flush()?;
            eprintln!(
                "rocectl: error: {}: {} frames on unsupported link types {unsupported_links:?} \
                 were not examined",
                path.display(),
                tally.unsupported
            );
        }
        if tally.passed + tally.failed == 0 {
            // Nothing was checked: a capture of the wrong traffic must not pass.
            out.flush()?;
            eprintln!(
                "rocectl: error: {}: no RoCEv2 frame (UDP to port {ROCEV2_PORT}) among its {} \
                 frames",
                path.display(),
                tally.frames
            );
            empty += 1;
        }
        total.merge(&tally);
    }
    if files.len() > 1 {
        write!(out, "total: {} files", files.len())?;
        if unreadable > 0 {
            write!(out, " ({unreadable} unreadable)")?;
        }
        write!(out, ", ")?;
        total.write(out)?;
    }
    writeln!(out, "{} passed, {} failed", total.passed, total.failed)?;
    let ok = total.failed == 0 && unreadable == 0 && empty == 0 && total.unsupported == 0;
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `rocectl pcap dump`: `N seconds summary` per frame, seconds relative to the first frame.
/// Frames the codec refuses print the reason; nothing here panics on bad input.
fn dump(path: &Path, out: &mut impl Write) -> Result<ExitCode> {
    let Capture {
        frames, truncated, ..
    } = load(path)?;
    let t0 = frames.first().map(|f| f.timestamp).unwrap_or_default();
    for (i, cf) in frames.iter().enumerate() {
        let t = cf.timestamp.saturating_sub(t0);
        write!(out, "{} {} ", i + 1, Seconds(t))?;
        match classify(cf) {
            Class::Roce => write_roce(cf, out)?,
            Class::Other(sliced) => write_other(cf, sliced.as_deref(), out)?,
            Class::UnsupportedLink => write!(
                out,
                "frame on unsupported link type {}, {} bytes",
                cf.linktype,
                cf.data.len()
            )?,
        }
        writeln!(out)?;
    }
    if let Some(t) = truncated {
        writeln!(out, "{}: {t}", path.display())?;
    }
    Ok(ExitCode::SUCCESS)
}

/// A duration as `seconds.microseconds`.
struct Seconds(Duration);

impl fmt::Display for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:06}", self.0.as_secs(), self.0.subsec_micros())
    }
}

/// `src.port > dst.port: BTH … payload=N`, with the ICRC verdict when it is wrong.
fn write_roce(cf: &CapturedFrame, out: &mut impl Write) -> io::Result<()> {
    let frame = match parse_unverified(cf) {
        Ok(frame) => frame,
        Err(e) => {
            return write!(
                out,
                "RoCEv2 frame, error {}: {e}, {} bytes",
                e.name(),
                cf.data.len()
            )
        }
    };
    write!(out, "{}: ", frame.repr)?;
    match frame.packet() {
        Ok(packet) => write!(out, "{packet}")?,
        Err(e) => write!(
            out,
            "error {}: {e}, UDP payload {} bytes",
            e.name(),
            frame.udp_payload.len()
        )?,
    }
    if let Some(failure) = icrc_mismatch(&frame) {
        write!(out, " [{failure}]")?;
    }
    Ok(())
}

/// A short summary of a frame that is not RoCEv2.
fn write_other(
    cf: &CapturedFrame,
    sliced: Option<&LaxSlicedPacket<'_>>,
    out: &mut impl Write,
) -> io::Result<()> {
    let Some(sliced) = sliced else {
        return write!(out, "non-RoCE frame, {} bytes", cf.data.len());
    };
    let (src, dst, fragmented, proto) = match &sliced.net {
        Some(LaxNetSlice::Arp(arp)) => return write_arp(arp, out),
        Some(LaxNetSlice::Ipv4(v4)) => {
            let h = v4.header();
            let p = v4.payload();
            (
                h.source_addr().to_string(),
                h.destination_addr().to_string(),
                p.fragmented,
                p.ip_number,
            )
        }
        Some(LaxNetSlice::Ipv6(v6)) => {
            let h = v6.header();
            let p = v6.payload();
            (
                h.source_addr().to_string(),
                h.destination_addr().to_string(),
                p.fragmented,
                p.ip_number,
            )
        }
        None => {
            return match &sliced.link {
                Some(LinkSlice::Ethernet2(eth)) => write!(
                    out,
                    "ethertype {:#06x}, {} bytes",
                    eth.ether_type().0,
                    cf.data.len()
                ),
                _ => write!(out, "non-RoCE frame, {} bytes", cf.data.len()),
            };
        }
    };
    match &sliced.transport {
        Some(TransportSlice::Tcp(tcp)) if !fragmented => write!(
            out,
            "TCP {src}.{} > {dst}.{} len {}",
            tcp.source_port(),
            tcp.destination_port(),
            tcp.payload().len()
        ),
        Some(TransportSlice::Udp(udp)) if !fragmented => write!(
            out,
            "UDP {src}.{} > {dst}.{} len {}",
            udp.source_port(),
            udp.destination_port(),
            udp.payload().len()
        ),
        Some(TransportSlice::Icmpv4(_)) => write!(out, "ICMP {src} > {dst}"),
        Some(TransportSlice::Icmpv6(_)) => write!(out, "ICMPv6 {src} > {dst}"),
        _ => {
            let what = if fragmented { "IP fragment" } else { "IP" };
            write!(out, "{what} {src} > {dst} proto {}", proto.0)
        }
    }
}

/// `ARP who-has A tell B`, `ARP reply A is-at MAC`, or just `ARP`.
fn write_arp(arp: &etherparse::ArpPacketSlice<'_>, out: &mut impl Write) -> io::Result<()> {
    let ipv4 = |b: &[u8]| <[u8; 4]>::try_from(b).ok().map(std::net::Ipv4Addr::from);
    let spa = ipv4(arp.sender_protocol_addr());
    let tpa = ipv4(arp.target_protocol_addr());
    match (arp.operation(), spa, tpa) {
        (ArpOperation::REQUEST, Some(spa), Some(tpa)) => {
            write!(out, "ARP who-has {tpa} tell {spa}")
        }
        (ArpOperation::REPLY, Some(spa), Some(_)) => {
            write!(out, "ARP reply {spa} is-at ")?;
            let mac = arp.sender_hw_addr();
            for (i, b) in mac.iter().enumerate() {
                let sep = if i == 0 { "" } else { ":" };
                write!(out, "{sep}{b:02x}")?;
            }
            Ok(())
        }
        _ => write!(out, "ARP"),
    }
}

/// `rocectl pcap sample`: the same bytes on every run (fixed timestamps, deterministic frames).
fn sample(path: &Path, out: &mut impl Write) -> Result<ExitCode> {
    let frames = samples::all();
    let create = || -> io::Result<()> {
        let file = BufWriter::new(File::create(path)?);
        let mut writer = PcapWriter::new(file)?;
        for (i, (_, bytes)) in frames.iter().enumerate() {
            // One millisecond apart from the epoch: the file is the same on every run.
            writer.write_frame(Duration::from_millis(i as u64), bytes)?;
        }
        writer.into_inner().flush()
    };
    create().with_context(|| format!("cannot write {}", path.display()))?;
    writeln!(
        out,
        "wrote {} sample frames to {}",
        frames.len(),
        path.display()
    )?;
    Ok(ExitCode::SUCCESS)
}
