//! Length-prefixed frames over TCP and a small big-endian encoder/decoder for the blobs the
//! ranks exchange (no serialisation crate: a dozen integers and byte strings).

use std::io::{self, Read, Write};

/// The largest frame accepted (a blob with a few thousand peers stays far below).
pub(crate) const MAX_FRAME: usize = 16 << 20;

/// Writes `payload` as one frame: a u32 length, then the bytes.
pub(crate) fn write_frame(w: &mut impl Write, payload: &[u8]) -> io::Result<()> {
    let len = u32::try_from(payload.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame too long"))?;
    let mut buf = Vec::with_capacity(4 + payload.len());
    buf.extend_from_slice(&len.to_be_bytes());
    buf.extend_from_slice(payload);
    w.write_all(&buf)?;
    w.flush()
}

/// Reads one frame.
pub(crate) fn read_frame(r: &mut impl Read) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes (at most {MAX_FRAME})"),
        ));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf)?;
    Ok(buf)
}

/// Appends big-endian fields.
#[derive(Default)]
pub(crate) struct Enc(pub(crate) Vec<u8>);

impl Enc {
    pub(crate) fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub(crate) fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub(crate) fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub(crate) fn bytes(&mut self, v: &[u8]) -> &mut Self {
        // Blobs are far below 4 GiB (frames are at most MAX_FRAME).
        self.u32(v.len() as u32);
        self.0.extend_from_slice(v);
        self
    }
}

/// Reads big-endian fields; every read past the end is an error, never a panic.
pub(crate) struct Dec<'a>(pub(crate) &'a [u8]);

/// A blob that does not decode.
#[derive(Debug)]
pub(crate) struct Short;

impl<'a> Dec<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Short> {
        if self.0.len() < n {
            return Err(Short);
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    pub(crate) fn u8(&mut self) -> Result<u8, Short> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn u32(&mut self) -> Result<u32, Short> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, Short> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }
    pub(crate) fn bytes(&mut self) -> Result<&'a [u8], Short> {
        let n = self.u32()? as usize;
        self.take(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_and_short_input_is_an_error() {
        let mut e = Enc::default();
        e.u8(7).u32(0xdead_beef).u64(u64::MAX - 1).bytes(b"gid");
        let mut d = Dec(&e.0);
        assert_eq!(d.u8().unwrap(), 7);
        assert_eq!(d.u32().unwrap(), 0xdead_beef);
        assert_eq!(d.u64().unwrap(), u64::MAX - 1);
        assert_eq!(d.bytes().unwrap(), b"gid");
        assert!(d.u8().is_err());
        let mut d = Dec(&e.0[..3]);
        assert!(d.u32().is_err());
        let mut framed = Vec::new();
        write_frame(&mut framed, b"abc").unwrap();
        assert_eq!(read_frame(&mut &framed[..]).unwrap(), b"abc");
        assert!(read_frame(&mut &framed[..5]).is_err());
    }
}
