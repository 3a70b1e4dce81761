//! Reading and writing captures (`std` feature), with `pcap-file`.
//!
//! [`PcapWriter`] writes classic pcap with the Ethernet link type and nanosecond timestamps,
//! which Wireshark and tshark open directly and dissect as RRoCE (UDP 4791).
//! [`read_capture`] reads pcap or pcapng (any byte order, micro- or nanosecond) and
//! [`parse_link`] finds the RoCEv2 frame inside the link types captures commonly use.

use std::io::{self, Read, Write};
use std::time::Duration;

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader};
use pcap_file::pcapng::{Block, PcapNgReader};
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

/// Reads every frame of a pcap or pcapng capture.
///
/// # Errors
/// I/O errors and malformed files (`InvalidData`).
pub fn read_capture(mut reader: impl Read) -> io::Result<Vec<CapturedFrame>> {
    let mut bytes = Vec::new();
    reader.read_to_end(&mut bytes)?;
    let mut out = Vec::new();
    if bytes.starts_with(&[0x0A, 0x0D, 0x0D, 0x0A]) {
        let mut ng = PcapNgReader::new(&bytes[..]).map_err(to_io)?;
        let mut links: Vec<u32> = Vec::new();
        while let Some(block) = ng.next_block() {
            match block.map_err(to_io)? {
                Block::SectionHeader(_) => links.clear(),
                Block::InterfaceDescription(idb) => links.push(u32::from(idb.linktype)),
                Block::EnhancedPacket(epb) => out.push(CapturedFrame {
                    timestamp: epb.timestamp,
                    linktype: links.get(epb.interface_id as usize).copied().unwrap_or(0),
                    orig_len: epb.original_len,
                    data: epb.data.into_owned(),
                }),
                Block::SimplePacket(spb) => out.push(CapturedFrame {
                    timestamp: Duration::ZERO,
                    linktype: links.first().copied().unwrap_or(0),
                    orig_len: spb.original_len,
                    data: spb.data.into_owned(),
                }),
                _ => {}
            }
        }
    } else {
        let mut rd = PcapReader::new(&bytes[..]).map_err(to_io)?;
        let linktype = u32::from(rd.header().datalink);
        while let Some(pkt) = rd.next_packet() {
            let pkt = pkt.map_err(to_io)?;
            out.push(CapturedFrame {
                timestamp: pkt.timestamp,
                linktype,
                orig_len: pkt.orig_len,
                data: pkt.data.into_owned(),
            });
        }
    }
    Ok(out)
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
