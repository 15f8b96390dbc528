//! Page-aligned owned buffers, the only kind of memory O_DIRECT accepts.

use std::alloc::{Layout, alloc, alloc_zeroed, dealloc};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

const ALIGN: usize = crate::IO_ALIGN_BYTES;

/// A zero-initialised byte buffer aligned to [`crate::IO_ALIGN_BYTES`].
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes (any length; O_DIRECT callers use multiples of 4 KiB).
    pub fn zeroed(len: usize) -> AlignedBuf {
        AlignedBuf::allocate(len, true)
    }

    /// A buffer of `len` bytes, zeroed when `zero` (else uninitialised: the caller fills every
    /// byte before anything reads it).
    fn allocate(len: usize, zero: bool) -> AlignedBuf {
        if len == 0 {
            // An array of u8 is only 1-aligned, so its dangling pointer would be too; an empty
            // buffer must still pass the alignment checks that callers make.
            #[repr(align(4096))]
            struct Page;
            const _: () = assert!(align_of::<Page>() == ALIGN);
            return AlignedBuf { ptr: NonNull::<Page>::dangling().cast(), len: 0 };
        }
        let layout = Layout::from_size_align(len, ALIGN).expect("buffer length overflows a Layout");
        // SAFETY: layout has non-zero size.
        let raw = unsafe { if zero { alloc_zeroed(layout) } else { alloc(layout) } };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }

    /// A buffer of `len` bytes for a device read to fill, not zeroed first. Only for a read
    /// that hands its buffer on once every byte has been transferred into it (a short or failed
    /// read drops it unread): zeroing each buffer before the device overwrote it cost about 1.5%
    /// of the node's CPU in 1 MiB sequential reads through the mount.
    pub(crate) fn for_read(len: usize) -> AlignedBuf {
        AlignedBuf::allocate(len, false)
    }

    /// A copy of `data`, written once (not zeroed first).
    pub fn from_slice(data: &[u8]) -> AlignedBuf {
        let buf = AlignedBuf::allocate(data.len(), false);
        // SAFETY: the fresh allocation holds `data.len()` bytes and cannot overlap `data`; after
        // the copy every byte is initialised.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf.ptr.as_ptr(), data.len()) };
        buf
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.len != 0 {
            let layout =
                Layout::from_size_align(self.len, ALIGN).expect("layout was valid at alloc");
            // SAFETY: allocated in `allocate` with this exact layout.
            unsafe { dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes: zeroed at allocation, or written
        // whole before anything reads them (`from_slice`, `for_read`).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and we hold &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> AlignedBuf {
        AlignedBuf::from_slice(self)
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

impl PartialEq for AlignedBuf {
    fn eq(&self, other: &AlignedBuf) -> bool {
        **self == **other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_page_aligned_and_zeroed() {
        for len in [0, 1, 4096, 65536, 1 << 20] {
            let buf = AlignedBuf::zeroed(len);
            assert_eq!(buf.as_ptr() as usize % ALIGN, 0);
            assert_eq!(buf.len(), len);
            assert!(buf.iter().all(|&b| b == 0));
        }
        let copy = AlignedBuf::from_slice(b"stria");
        assert_eq!(&copy[..], b"stria");
        // Copies are aligned too, of every length, and hold exactly the bytes copied.
        for len in [0, 1, 4095, 4096, 1 << 20] {
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8 + 1).collect();
            let copy = AlignedBuf::from_slice(&data);
            assert_eq!(copy.as_ptr() as usize % ALIGN, 0);
            assert_eq!(&copy[..], &data[..]);
            assert_eq!(copy.clone(), copy);
        }
    }
}
