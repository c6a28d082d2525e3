//! Small fixed-size extended headers share one shape; this macro writes the view.

/// Defines `$name<T>` with `new_unchecked`, `new_checked` and `into_inner` over a
/// header of `$len` bytes.
macro_rules! header_view {
    ($(#[$m:meta])* $name:ident, $len:expr) => {
        $(#[$m])*
        #[derive(Debug, Clone)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Wraps a buffer without checking its length.
            pub fn new_unchecked(buffer: T) -> Self {
                $name { buffer }
            }
            /// Wraps a buffer long enough for the header.
            pub fn new_checked(buffer: T) -> $crate::Result<Self> {
                let p = $name { buffer };
                p.check_len()?;
                Ok(p)
            }
            /// [`Error::Truncated`]($crate::Error::Truncated) if the buffer is shorter
            /// than the header.
            pub fn check_len(&self) -> $crate::Result<()> {
                if self.buffer.as_ref().len() < $len {
                    return Err($crate::Error::Truncated);
                }
                Ok(())
            }
            /// Gives the buffer back.
            pub fn into_inner(self) -> T {
                self.buffer
            }
            #[allow(dead_code)]
            fn u32_at(&self, at: usize) -> u32 {
                let b = self.buffer.as_ref();
                u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
            }
            #[allow(dead_code)]
            fn u64_at(&self, at: usize) -> u64 {
                let mut w = [0u8; 8];
                w.copy_from_slice(&self.buffer.as_ref()[at..at + 8]);
                u64::from_be_bytes(w)
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $name<T> {
            #[allow(dead_code)]
            fn put_u32(&mut self, at: usize, v: u32) {
                self.buffer.as_mut()[at..at + 4].copy_from_slice(&v.to_be_bytes());
            }
            #[allow(dead_code)]
            fn put_u64(&mut self, at: usize, v: u64) {
                self.buffer.as_mut()[at..at + 8].copy_from_slice(&v.to_be_bytes());
            }
        }
    };
}
