//! Reading and writing captures (`std` feature), with `pcap-file`.
//!
//! [`PcapWriter`] writes classic pcap with the Ethernet link type and nanosecond timestamps,
//! which Wireshark and tshark open directly and dissect as RRoCE (UDP 4791).
//! [`read_capture`] reads pcap or pcapng (any byte order, micro- or nanosecond, plain or
//! gzip-compressed), [`read_capture_lenient`] also the whole records of a capture cut short
//! mid-record (a writer killed mid-write), and
//! [`parse_link`] finds the RoCEv2 frame inside the link types captures commonly use.

use std::io::{self, Read, Write};
use std::time::Duration;

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapParser};
use pcap_file::pcapng::{Block, PcapNgParser};
use pcap_file::{DataLink, Endianness, PcapError, TsResolution};

use crate::{Caps, Frame, ParseError};

/// Link type numbers (tcpdump.org `LINKTYPE_*`).
pub mod linktype {
    /// BSD loopback (4-byte address family header).
    pub const NULL: u32 = 0;
    /// Ethernet.
    pub const ETHERNET: u32 = 1;
    /// Raw IP (OpenBSD value).
    pub const RAW_OPENBSD: u32 = 12;
    /// Raw IP (BSD/OS value).
    pub const RAW_BSDOS: u32 = 14;
    /// Raw IP.
    pub const RAW: u32 = 101;
    /// OpenBSD loopback.
    pub const LOOP: u32 = 108;
    /// Linux cooked capture v1.
    pub const LINUX_SLL: u32 = 113;
    /// Raw IPv4.
    pub const IPV4: u32 = 228;
    /// Raw IPv6.
    pub const IPV6: u32 = 229;
    /// Linux cooked capture v2.
    pub const LINUX_SLL2: u32 = 276;
}

fn to_io(e: PcapError) -> io::Error {
    match e {
        PcapError::IoError(e) => e,
        other => io::Error::new(io::ErrorKind::InvalidData, other.to_string()),
    }
}

/// Writes frames to a pcap file (Ethernet, nanosecond timestamps, snaplen 65535).
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    inner: pcap_file::pcap::PcapWriter<W>,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the file header.
    ///
    /// # Errors
    /// Any I/O error of the writer.
    pub fn new(writer: W) -> io::Result<Self> {
        let header = PcapHeader {
            datalink: DataLink::ETHERNET,
            ts_resolution: TsResolution::NanoSecond,
            snaplen: 65_535,
            endianness: Endianness::Little,
            ..PcapHeader::default()
        };
        let inner = pcap_file::pcap::PcapWriter::with_header(writer, header).map_err(to_io)?;
        Ok(Self { inner })
    }

    /// Appends one frame with its timestamp (time since the Unix epoch).
    ///
    /// # Errors
    /// Any I/O error of the writer.
    pub fn write_frame(&mut self, timestamp: Duration, frame: &[u8]) -> io::Result<()> {
        let len = u32::try_from(frame.len()).unwrap_or(u32::MAX);
        self.inner
            .write_packet(&PcapPacket::new(timestamp, len, frame))
            .map(drop)
            .map_err(to_io)
    }

    /// The underlying writer.
    pub fn into_inner(self) -> W {
        self.inner.into_writer()
    }
}

/// One captured frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapturedFrame {
    /// Timestamp since the Unix epoch.
    pub timestamp: Duration,
    /// Link type of the interface it was captured on.
    pub linktype: u32,
    /// Length on the wire (may exceed `data.len()` with a short snaplen).
    pub orig_len: u32,
    /// The captured bytes.
    pub data: Vec<u8>,
}

/// The record (pcap) or block (pcapng) a capture ends in the middle of: what a writer killed
/// mid-write leaves. Its `Display` is `truncated last record at offset N, K bytes of M`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Truncated {
    /// Where the record starts, in bytes from the start of the (decompressed) capture.
    pub offset: usize,
    /// The bytes of it the capture holds.
    pub have: usize,
    /// Its whole length, header included, as its header says; `None` when the header itself is
    /// cut short.
    pub length: Option<usize>,
    /// The length of the record header (16 for pcap, 8 for the start of a pcapng block).
    pub header_len: usize,
}

impl core::fmt::Display for Truncated {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "truncated last record at offset {}, ", self.offset)?;
        match self.length {
            Some(len) => write!(f, "{} bytes of {len}", self.have),
            None => write!(
                f,
                "{} bytes of its {}-byte header",
                self.have, self.header_len
            ),
        }
    }
}

/// A capture read by [`read_capture_lenient`]: its whole records, and the record it ends in the
/// middle of, if any.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Capture {
    /// Every whole frame, in order.
    pub frames: Vec<CapturedFrame>,
    /// The record cut short at the end of the file.
    pub truncated: Option<Truncated>,
    /// The file was gzip-compressed.
    pub gzip: bool,
}

/// The first two bytes of a gzip stream (RFC 1952).
const GZIP_MAGIC: [u8; 2] = [0x1F, 0x8B];

/// The first four bytes of a pcapng file (a Section Header Block).
const PCAPNG_MAGIC: [u8; 4] = [0x0A, 0x0D, 0x0D, 0x0A];

/// Reads every frame of a pcap or pcapng capture, gzip-compressed or not (recognised by its
/// magic number, whatever the file is called).
///
/// # Errors
/// I/O errors and malformed files (`InvalidData`); a file that ends in the middle of a record
/// is `UnexpectedEof` (see [`read_capture_lenient`] to read the records before it).
pub fn read_capture(reader: impl Read) -> io::Result<Vec<CapturedFrame>> {
    let capture = read_capture_lenient(reader)?;
    match capture.truncated {
        Some(t) => Err(io::Error::new(io::ErrorKind::UnexpectedEof, t.to_string())),
        None => Ok(capture.frames),
    }
}

/// Reads every whole frame of a pcap or pcapng capture, gzip-compressed or not, and reports
/// the record the file ends in the middle of instead of failing: a capture whose writer was
/// killed mid-write (tshark reads those too). A gzip stream cut short is read as far as it goes.
///
/// # Errors
/// I/O errors and malformed files (`InvalidData`), including a file header cut short.
pub fn read_capture_lenient(mut reader: impl Read) -> io::Result<Capture> {
    let mut bytes = Vec::new();
    reader.read_to_end(&mut bytes)?;
    let gzip = bytes.starts_with(&GZIP_MAGIC);
    if gzip {
        bytes = gunzip(&bytes)?;
    }
    let mut capture = if bytes.starts_with(&PCAPNG_MAGIC) {
        read_pcapng(&bytes)?
    } else {
        read_pcap(&bytes)?
    };
    capture.gzip = gzip;
    Ok(capture)
}

/// Decompresses a gzip stream (every member); a stream cut short gives what it holds.
fn gunzip(compressed: &[u8]) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    match flate2::read::MultiGzDecoder::new(compressed).read_to_end(&mut out) {
        Ok(_) => Ok(out),
        // `read_to_end` keeps what it decompressed before the stream ended.
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof && !out.is_empty() => Ok(out),
        Err(e) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("gzip: {e}"),
        )),
    }
}

/// Where `rest` starts in `all` (`rest` is a suffix of `all`).
fn offset_in(all: &[u8], rest: &[u8]) -> usize {
    all.len() - rest.len()
}

/// A little- or big-endian `u32` at `at` in `b`, if `b` holds it.
fn u32_at(b: &[u8], at: usize, endianness: Endianness) -> Option<u32> {
    let bytes: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
    Some(match endianness {
        Endianness::Big => u32::from_be_bytes(bytes),
        Endianness::Little => u32::from_le_bytes(bytes),
    })
}

/// The record `rest` starts with, cut short: `len_at` is where its header holds its length
/// (`len_base` added: the pcap record header is not counted in its length field).
fn truncated(
    all: &[u8],
    rest: &[u8],
    header_len: usize,
    len_at: usize,
    len_base: usize,
    endianness: Endianness,
) -> Truncated {
    let length = if rest.len() >= header_len {
        u32_at(rest, len_at, endianness).map(|l| l as usize + len_base)
    } else {
        None
    };
    Truncated {
        offset: offset_in(all, rest),
        have: rest.len(),
        length,
        header_len,
    }
}

/// Reads classic pcap records until the end or a record cut short.
fn read_pcap(bytes: &[u8]) -> io::Result<Capture> {
    let (mut rest, parser) = PcapParser::new(bytes).map_err(|e| match e {
        PcapError::IncompleteBuffer => io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the 24-byte pcap file header is cut short",
        ),
        other => to_io(other),
    })?;
    let header = parser.header();
    let linktype = u32::from(header.datalink);
    let mut capture = Capture::default();
    while !rest.is_empty() {
        match parser.next_packet(rest) {
            Ok((next, pkt)) => {
                capture.frames.push(CapturedFrame {
                    timestamp: pkt.timestamp,
                    linktype,
                    orig_len: pkt.orig_len,
                    data: pkt.data.into_owned(),
                });
                rest = next;
            }
            Err(PcapError::IncompleteBuffer) => {
                // ts_sec, ts_frac, incl_len, orig_len: the length is the third field.
                capture.truncated = Some(truncated(bytes, rest, 16, 8, 16, header.endianness));
                break;
            }
            Err(e) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("record at offset {}: {}", offset_in(bytes, rest), to_io(e)),
                ))
            }
        }
    }
    Ok(capture)
}

/// Reads pcapng blocks until the end or a block cut short.
fn read_pcapng(bytes: &[u8]) -> io::Result<Capture> {
    let (mut rest, mut parser) = PcapNgParser::new(bytes).map_err(|e| match e {
        PcapError::IncompleteBuffer => io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the pcapng section header block is cut short",
        ),
        other => to_io(other),
    })?;
    let mut capture = Capture::default();
    // The section header the parser consumed describes no interface yet.
    let mut links: Vec<u32> = Vec::new();
    while !rest.is_empty() {
        let endianness = parser.section().endianness;
        let (next, block) = match parser.next_block(rest) {
            Ok(ok) => ok,
            Err(PcapError::IncompleteBuffer) => {
                // block type, block total length (which counts the whole block).
                capture.truncated = Some(truncated(bytes, rest, 8, 4, 0, endianness));
                break;
            }
            Err(e) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("block at offset {}: {}", offset_in(bytes, rest), to_io(e)),
                ))
            }
        };
        match block {
            Block::SectionHeader(_) => links.clear(),
            Block::InterfaceDescription(idb) => links.push(u32::from(idb.linktype)),
            Block::EnhancedPacket(epb) => capture.frames.push(CapturedFrame {
                timestamp: epb.timestamp,
                linktype: links.get(epb.interface_id as usize).copied().unwrap_or(0),
                orig_len: epb.original_len,
                data: epb.data.into_owned(),
            }),
            Block::SimplePacket(spb) => capture.frames.push(CapturedFrame {
                timestamp: Duration::ZERO,
                linktype: links.first().copied().unwrap_or(0),
                orig_len: spb.original_len,
                data: spb.data.into_owned(),
            }),
            _ => {}
        }
        rest = next;
    }
    Ok(capture)
}

/// Where the IP packet starts for a link type, or `None` if it is not supported.
pub fn l3_offset(linktype: u32, data: &[u8]) -> Option<usize> {
    let ip_after = |off: usize| (data.len() > off).then_some(off);
    match linktype {
        linktype::LINUX_SLL => {
            let proto = u16::from_be_bytes([*data.get(14)?, *data.get(15)?]);
            (matches!(proto, 0x0800 | 0x86DD) && data.len() > 16).then_some(16)
        }
        linktype::LINUX_SLL2 => {
            let proto = u16::from_be_bytes([*data.first()?, *data.get(1)?]);
            (matches!(proto, 0x0800 | 0x86DD) && data.len() > 20).then_some(20)
        }
        linktype::RAW
        | linktype::RAW_OPENBSD
        | linktype::RAW_BSDOS
        | linktype::IPV4
        | linktype::IPV6 => ip_after(0),
        linktype::NULL | linktype::LOOP => ip_after(4),
        _ => None,
    }
}

/// Parses the RoCEv2 frame inside a captured frame of any supported link type. Ethernet frames
/// keep their Ethernet header in the result; other link types give a frame with `eth: None`.
///
/// # Errors
/// `BadFrame` for an unsupported link type, `NotRoce` for a non-IP payload of a supported one,
/// otherwise as [`Frame::parse_ethernet`].
pub fn parse_link<'a>(linktype: u32, data: &'a [u8], caps: &Caps) -> Result<Frame<'a>, ParseError> {
    if linktype == linktype::ETHERNET {
        return Frame::parse_ethernet(data, caps);
    }
    let supported = matches!(
        linktype,
        linktype::LINUX_SLL
            | linktype::LINUX_SLL2
            | linktype::RAW
            | linktype::RAW_OPENBSD
            | linktype::RAW_BSDOS
            | linktype::IPV4
            | linktype::IPV6
            | linktype::NULL
            | linktype::LOOP
    );
    if !supported {
        return Err(ParseError::BadFrame);
    }
    // A supported link type carrying something other than IP (ARP in a cooked capture).
    let off = l3_offset(linktype, data).ok_or(ParseError::NotRoce)?;
    Frame::parse_ip(&data[off..], caps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_then_read() {
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        w.write_frame(Duration::new(1, 5), &[1, 2, 3]).unwrap();
        w.write_frame(Duration::new(2, 999_999_999), &[4; 60])
            .unwrap();
        let bytes = w.into_inner();
        // Nanosecond magic, little endian.
        assert_eq!(&bytes[..4], &[0x4d, 0x3c, 0xb2, 0xa1]);
        let frames = read_capture(&bytes[..]).unwrap();
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].timestamp, Duration::new(1, 5));
        assert_eq!(frames[0].data, vec![1, 2, 3]);
        assert_eq!(frames[1].linktype, linktype::ETHERNET);
        assert_eq!(frames[1].timestamp, Duration::new(2, 999_999_999));
    }

    /// Three frames of different lengths, as classic pcap.
    fn three_frames() -> (Vec<u8>, Vec<Vec<u8>>) {
        let frames: Vec<Vec<u8>> = vec![vec![0x11; 60], vec![0x22; 7], vec![0x33; 90]];
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        for (i, f) in frames.iter().enumerate() {
            w.write_frame(Duration::from_millis(i as u64), f).unwrap();
        }
        (w.into_inner(), frames)
    }

    #[test]
    fn a_pcap_cut_anywhere_in_its_last_record_keeps_the_others() {
        let (bytes, frames) = three_frames();
        let last = bytes.len() - (16 + frames[2].len());
        // Every length from the record's first byte to one short of its end.
        for cut in last..bytes.len() {
            let c = read_capture_lenient(&bytes[..cut]).unwrap();
            let data: Vec<_> = c.frames.iter().map(|f| f.data.clone()).collect();
            assert_eq!(data, frames[..2], "cut at {cut}");
            if cut == last {
                // A file that ends on a record boundary is whole.
                assert_eq!(c.truncated, None);
                continue;
            }
            let t = c
                .truncated
                .unwrap_or_else(|| panic!("cut at {cut}: not reported"));
            assert_eq!(t.offset, last);
            assert_eq!(t.have, cut - last);
            let want_len = (cut - last >= 16).then_some(16 + frames[2].len());
            assert_eq!(t.length, want_len, "cut at {cut}");
            let text = t.to_string();
            assert!(
                text.starts_with(&format!(
                    "truncated last record at offset {last}, {} bytes of ",
                    cut - last
                )),
                "{text}"
            );
            // The strict reader refuses it, saying why.
            let e = read_capture(&bytes[..cut]).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
            assert_eq!(e.to_string(), text);
        }
        let whole = read_capture_lenient(&bytes[..]).unwrap();
        assert_eq!(whole.frames.len(), 3);
        assert_eq!(whole.truncated, None);
        assert!(!whole.gzip);
        // The file header itself cut short is an error, not an empty capture.
        assert!(read_capture_lenient(&bytes[..20]).is_err());
    }

    #[test]
    fn a_pcapng_cut_anywhere_in_its_last_block_keeps_the_others() {
        use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
        use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionBlock;
        use pcap_file::pcapng::PcapNgWriter;

        let mut w = PcapNgWriter::new(Vec::new()).unwrap();
        w.write_pcapng_block(InterfaceDescriptionBlock::new(DataLink::ETHERNET, 0))
            .unwrap();
        let mut ends = Vec::new();
        for (i, len) in [60usize, 90].into_iter().enumerate() {
            w.write_pcapng_block(EnhancedPacketBlock {
                interface_id: 0,
                timestamp: Duration::from_secs(i as u64),
                original_len: len as u32,
                data: vec![i as u8; len].into(),
                options: vec![],
            })
            .unwrap();
            ends.push(w.get_ref().len());
        }
        let bytes = w.into_inner();
        let last = ends[0];
        for cut in last + 1..bytes.len() {
            let c = read_capture_lenient(&bytes[..cut]).unwrap();
            assert_eq!(c.frames.len(), 1, "cut at {cut}");
            assert_eq!(c.frames[0].linktype, linktype::ETHERNET);
            let t = c
                .truncated
                .unwrap_or_else(|| panic!("cut at {cut}: not reported"));
            assert_eq!((t.offset, t.have), (last, cut - last));
            let want_len = (cut - last >= 8).then_some(bytes.len() - last);
            assert_eq!(t.length, want_len, "cut at {cut}");
        }
        assert_eq!(read_capture(&bytes[..]).unwrap().len(), 2);
    }

    #[test]
    fn gzip_captures_are_read_by_their_magic() {
        use flate2::write::GzEncoder;

        let (bytes, frames) = three_frames();
        let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&bytes).unwrap();
        let compressed = gz.finish().unwrap();
        assert_eq!(&compressed[..2], &GZIP_MAGIC);
        let c = read_capture_lenient(&compressed[..]).unwrap();
        assert!(c.gzip);
        assert_eq!(c.truncated, None);
        let data: Vec<_> = c.frames.iter().map(|f| f.data.clone()).collect();
        assert_eq!(data, frames);
        assert_eq!(read_capture(&compressed[..]).unwrap().len(), 3);
        // A gzip stream cut short gives the whole records it holds and reports the cut one.
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        let mut x = 1u32;
        for i in 0..200 {
            // Bytes that do not compress, so that half the stream is about half the frames.
            let frame: Vec<u8> = (0..100)
                .map(|_| {
                    x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                    (x >> 16) as u8
                })
                .collect();
            w.write_frame(Duration::from_millis(i), &frame).unwrap();
        }
        let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&w.into_inner()).unwrap();
        let compressed = gz.finish().unwrap();
        let short = read_capture_lenient(&compressed[..compressed.len() / 2]).unwrap();
        assert!(
            (50..150).contains(&short.frames.len()),
            "{}",
            short.frames.len()
        );
        assert!(short.truncated.is_some());
        // Not gzip inside: an error that says so.
        let e = read_capture(&[0x1F, 0x8B, 0xFF, 0, 0, 0, 0, 0, 0, 0xFF, 1, 2][..]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().starts_with("gzip: "), "{e}");
        let e = read_capture(&GZIP_MAGIC[..]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().starts_with("gzip: "), "{e}");
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(read_capture(&b"not a capture at all"[..]).is_err());
        assert_eq!(l3_offset(linktype::LINUX_SLL, &[0; 10]), None);
        assert_eq!(l3_offset(999, &[0; 100]), None);
        // Short cooked frames (found by fuzzing): no offset past the end, no panic.
        assert_eq!(l3_offset(linktype::LINUX_SLL2, &[0x08, 0x00, 0, 0]), None);
        assert_eq!(
            l3_offset(
                linktype::LINUX_SLL,
                &[0; 14]
                    .iter()
                    .chain(&[0x08, 0x00])
                    .copied()
                    .collect::<Vec<_>>()
            ),
            None
        );
        let caps = Caps::default();
        assert!(parse_link(linktype::LINUX_SLL2, &[0x86, 0xDD, 1], &caps).is_err());
    }
}
