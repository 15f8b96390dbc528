//! The data part of a reply as the buffers that hold it.

use std::fmt;
use std::ops::{Bound, RangeBounds};

use bytes::{Bytes, BytesMut};

/// The bulk data of a reply: its bytes in order, as one or more reference-counted buffers.
///
/// A service that holds what it answers in several buffers of its own (a target's cached
/// blocks) hands them over as they are. A caller in the same process then reads them where
/// they lie, and a gateway sends them on with one vectored write: no buffer is allocated and
/// filled on the way. Over a connection the parts go out one after another and arrive as one.
#[derive(Clone, Default)]
pub struct Data {
    /// Never holds an empty buffer.
    parts: Vec<Bytes>,
    len: usize,
}

impl Data {
    pub fn new() -> Data {
        Data::default()
    }

    /// Bytes in all parts together.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The buffers, in order; none is empty.
    pub fn parts(&self) -> &[Bytes] {
        &self.parts
    }

    pub fn into_parts(self) -> Vec<Bytes> {
        self.parts
    }

    /// Appends `part` (an empty one is dropped).
    pub fn push(&mut self, part: Bytes) {
        if !part.is_empty() {
            self.len += part.len();
            self.parts.push(part);
        }
    }

    /// The bytes as one buffer: free for data in one part, a copy for more.
    pub fn into_bytes(mut self) -> Bytes {
        match self.parts.len() {
            0 => Bytes::new(),
            1 => self.parts.pop().expect("one part"),
            _ => {
                let mut out = BytesMut::with_capacity(self.len);
                for part in &self.parts {
                    out.extend_from_slice(part);
                }
                out.freeze()
            }
        }
    }

    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = vec![0; self.len];
        self.copy_to_slice(&mut out);
        out
    }

    /// Copies the first `out.len()` bytes into `out`.
    ///
    /// # Panics
    /// When `out` is longer than the data.
    pub fn copy_to_slice(&self, out: &mut [u8]) {
        assert!(out.len() <= self.len, "copy of {} bytes from {}", out.len(), self.len);
        let mut at = 0;
        for part in &self.parts {
            if at == out.len() {
                break;
            }
            let take = part.len().min(out.len() - at);
            out[at..at + take].copy_from_slice(&part[..take]);
            at += take;
        }
    }

    /// The bytes in `range`, as slices of the same buffers (no copy).
    ///
    /// # Panics
    /// When the range is decreasing or runs past the end, as [`Bytes::slice`].
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Data {
        let start = match range.start_bound() {
            Bound::Included(&n) => n,
            Bound::Excluded(&n) => n + 1,
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&n) => n + 1,
            Bound::Excluded(&n) => n,
            Bound::Unbounded => self.len,
        };
        assert!(start <= end && end <= self.len, "range {start}..{end} of {} bytes", self.len);
        let mut out = Data::new();
        let mut at = 0;
        for part in &self.parts {
            let (from, to) = (at, at + part.len());
            at = to;
            if to <= start {
                continue;
            }
            if from >= end {
                break;
            }
            out.push(part.slice(start.max(from) - from..end.min(to) - from));
        }
        out
    }
}

impl From<Bytes> for Data {
    fn from(bytes: Bytes) -> Data {
        let mut data = Data::new();
        data.push(bytes);
        data
    }
}

impl From<Vec<u8>> for Data {
    fn from(bytes: Vec<u8>) -> Data {
        Data::from(Bytes::from(bytes))
    }
}

/// The buffers as they are (empty ones dropped), in the same vector.
impl From<Vec<Bytes>> for Data {
    fn from(mut parts: Vec<Bytes>) -> Data {
        parts.retain(|part| !part.is_empty());
        let len = parts.iter().map(Bytes::len).sum();
        Data { parts, len }
    }
}

impl FromIterator<Bytes> for Data {
    fn from_iter<I: IntoIterator<Item = Bytes>>(parts: I) -> Data {
        let mut data = Data::new();
        for part in parts {
            data.push(part);
        }
        data
    }
}

/// Equal when the bytes are, however they are split.
impl PartialEq for Data {
    fn eq(&self, other: &Data) -> bool {
        self.len == other.len
            && self
                .parts
                .iter()
                .flat_map(|p| p.iter())
                .eq(other.parts.iter().flat_map(|p| p.iter()))
    }
}

impl Eq for Data {}

impl PartialEq<[u8]> for Data {
    fn eq(&self, other: &[u8]) -> bool {
        self.len == other.len() && self.parts.iter().flat_map(|p| p.iter()).eq(other.iter())
    }
}

impl PartialEq<Bytes> for Data {
    fn eq(&self, other: &Bytes) -> bool {
        *self == other[..]
    }
}

impl fmt::Debug for Data {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.parts.as_slice() {
            [] => f.write_str("Data(empty)"),
            [one] => write!(f, "Data({one:?})"),
            parts => write!(f, "Data({} bytes in {} parts)", self.len, parts.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(bytes: &[u8], at: &[usize]) -> Data {
        let mut cuts = vec![0];
        cuts.extend_from_slice(at);
        cuts.push(bytes.len());
        cuts.windows(2).map(|w| Bytes::copy_from_slice(&bytes[w[0]..w[1]])).collect()
    }

    #[test]
    fn slices_copies_and_joins_agree_with_the_bytes_whatever_the_split() {
        let bytes: Vec<u8> = (0..100u8).collect();
        for at in [&[][..], &[1], &[50], &[10, 10, 60], &[33, 66, 99]] {
            let data = split(&bytes, at);
            assert_eq!(data.len(), 100);
            assert!(data.parts().iter().all(|p| !p.is_empty()), "{at:?}");
            assert_eq!(data.to_vec(), bytes, "{at:?}");
            assert_eq!(data.clone().into_bytes(), bytes[..], "{at:?}");
            for (start, end) in [(0, 100), (0, 0), (5, 55), (50, 50), (49, 51), (99, 100), (10, 61)]
            {
                let part = data.slice(start..end);
                assert_eq!(part.to_vec(), bytes[start..end], "{at:?} {start}..{end}");
                assert_eq!(part.len(), end - start);
                assert!(part.parts().iter().all(|p| !p.is_empty()));
            }
            let mut head = [0u8; 37];
            data.copy_to_slice(&mut head);
            assert_eq!(head[..], bytes[..37]);
            assert_eq!(data, Data::from(bytes.clone()));
            let mut with_empty = data.parts().to_vec();
            with_empty.insert(0, Bytes::new());
            let from_vec = Data::from(with_empty);
            assert!(from_vec == data && from_vec.parts().iter().all(|p| !p.is_empty()));
            assert_eq!(data, bytes[..]);
            assert_ne!(data, bytes[..99]);
        }
    }

    #[test]
    #[should_panic(expected = "range")]
    fn a_slice_past_the_end_panics() {
        let _ = Data::from(vec![1, 2, 3]).slice(2..4);
    }
}
