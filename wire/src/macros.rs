//! Boilerplate shared by every header view: the struct, `new_unchecked`, `new_checked`,
//! `check_len` and `into_inner`, so each header file only writes its fields.

/// Declares `pub struct Packet<T>` over a buffer and its length-checking constructors.
/// `HEADER_LEN` must be defined in the calling module.
macro_rules! header_view {
    ($(#[$doc:meta])*) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct Packet<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> Packet<T> {
            /// Wraps a buffer without checking its length; accessors may then panic on a short
            /// buffer. Use on the emit path, where the buffer is `buffer_len()` by construction.
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// Wraps a buffer after [`Self::check_len`]: every accessor is then panic-free.
            ///
            /// # Errors
            /// [`ParseError::Truncated`](crate::ParseError::Truncated) if the buffer is shorter
            /// than the header.
            pub fn new_checked(buffer: T) -> crate::Result<Self> {
                let packet = Self::new_unchecked(buffer);
                packet.check_len()?;
                Ok(packet)
            }

            /// Checks that the buffer holds the whole header.
            ///
            /// # Errors
            /// [`ParseError::Truncated`](crate::ParseError::Truncated) if it does not.
            pub fn check_len(&self) -> crate::Result<()> {
                if self.buffer.as_ref().len() < HEADER_LEN {
                    Err(crate::ParseError::Truncated)
                } else {
                    Ok(())
                }
            }

            /// The underlying buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }
        }
    };
}

pub(crate) use header_view;

/// Big-endian reads and writes of fixed-size fields. Callers pass exactly-sized slices
/// (`&buf[field::X]`); a shorter slice is a bug in the caller and panics on index.
pub(crate) mod be {
    pub(crate) fn u16(b: &[u8]) -> u16 {
        u16::from_be_bytes([b[0], b[1]])
    }
    pub(crate) fn u24(b: &[u8]) -> u32 {
        u32::from_be_bytes([0, b[0], b[1], b[2]])
    }
    pub(crate) fn u32(b: &[u8]) -> u32 {
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    }
    pub(crate) fn u64(b: &[u8]) -> u64 {
        u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
    }
    pub(crate) fn set_u16(b: &mut [u8], v: u16) {
        b[..2].copy_from_slice(&v.to_be_bytes());
    }
    pub(crate) fn set_u24(b: &mut [u8], v: u32) {
        b[..3].copy_from_slice(&v.to_be_bytes()[1..]);
    }
    pub(crate) fn set_u32(b: &mut [u8], v: u32) {
        b[..4].copy_from_slice(&v.to_be_bytes());
    }
    pub(crate) fn set_u64(b: &mut [u8], v: u64) {
        b[..8].copy_from_slice(&v.to_be_bytes());
    }
}
