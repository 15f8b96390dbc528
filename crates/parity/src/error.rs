//! The one error type of this crate: what `reconstruct` says when the stripe it is handed cannot be
//! rebuilt as asked. Programmer errors elsewhere (mismatched lengths in `xor_gen`/`pq_gen`) panic.

use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParityError {
    /// More chunks are missing than there are parity chunks to rebuild them from.
    TooManyMissing { missing_count: usize, parity_count: usize },
    /// A missing index does not name a chunk of the stripe.
    BadIndex { index: usize, chunk_count: usize },
    /// The same chunk is listed as missing twice.
    DuplicateIndex { index: usize },
    /// A chunk's length differs from chunk 0's.
    LengthMismatch { index: usize, len: usize, expected_len: usize },
    /// The stripe is neither RAID 5 (one parity chunk) nor RAID 6 (P then Q), or its data count is
    /// outside `1..=DATA_COUNT_MAX`.
    BadLayout { chunk_count: usize, data_count: usize },
}

impl fmt::Display for ParityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooManyMissing { missing_count, parity_count } => write!(
                f,
                "{missing_count} chunks missing but the stripe has only {parity_count} parity \
                 chunks to rebuild them from"
            ),
            Self::BadIndex { index, chunk_count } => {
                write!(f, "missing chunk index {index} is outside the stripe of {chunk_count}")
            }
            Self::DuplicateIndex { index } => {
                write!(f, "chunk {index} is listed as missing more than once")
            }
            Self::LengthMismatch { index, len, expected_len } => write!(
                f,
                "chunk {index} is {len} bytes long but chunk 0 is {expected_len}; all chunks of a \
                 stripe must have the same length"
            ),
            Self::BadLayout { chunk_count, data_count } => write!(
                f,
                "a stripe of {chunk_count} chunks with {data_count} data chunks is neither RAID 5 \
                 (1 parity chunk) nor RAID 6 (2), or has an unsupported data count"
            ),
        }
    }
}

impl std::error::Error for ParityError {}
