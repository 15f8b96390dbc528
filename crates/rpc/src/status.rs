//! Stable status codes of response frames, in blocks:
//!
//! | range       | owner                                                        |
//! |-------------|--------------------------------------------------------------|
//! | 0           | ok                                                           |
//! | 1..=999     | the RPC layer itself (this module)                           |
//! | 1000..=2999 | services' own codes (meta 1000s, storage 2000s, as methods)  |
//! | 3000..=3999 | file-system errors: `3000 + FsStatus as u16`                 |
//! | 4000..      | free for later services                                      |
//!
//! A number, once given out, is never reused for something else. The message part of a
//! response with a transport code (1..=999) is UTF-8 text saying what went wrong.

use stria_proto::fs::FsStatus;

/// The request was carried out.
pub const OK: u16 = 0;
/// The request's message part could not be decoded (or was invalid for its method).
pub const BAD_REQUEST: u16 = 1;
/// The server has no handler for the method number.
pub const UNKNOWN_METHOD: u16 = 2;
/// The request's deadline had passed before the server got to it; it did not run.
pub const DEADLINE_EXCEEDED: u16 = 3;
/// The server refuses work for now (connection limit, queue full); retry later.
pub const OVERLOADED: u16 = 4;
/// The handler failed unexpectedly (it panicked); whether it had effects is unknown.
pub const INTERNAL: u16 = 5;
/// The server is shutting down and takes no new work on this connection.
pub const SHUTTING_DOWN: u16 = 6;
/// The peer sent a frame that broke the protocol; the connection is closed after this.
pub const BAD_FRAME: u16 = 7;
/// The peer did not prove it holds the cluster secret; the connection is closed after this.
pub const UNAUTHENTICATED: u16 = 8;

/// First code of the block the services own.
pub const SERVICE_BASE: u16 = 1000;
/// `FsStatus` codes travel as `FS_STATUS_BASE + n` (the same rule as `stria_proto::wire`).
pub const FS_STATUS_BASE: u16 = stria_proto::wire::FS_STATUS_BASE;
/// The file-system block holds at most this many codes.
pub const FS_STATUS_BLOCK_LEN: u16 = 1000;

const _: () = assert!(UNAUTHENTICATED < SERVICE_BASE);
const _: () = assert!(SERVICE_BASE <= FS_STATUS_BASE);

/// A short name for a transport status, for logs and error messages.
pub fn name(code: u16) -> &'static str {
    match code {
        OK => "ok",
        BAD_REQUEST => "bad request",
        UNKNOWN_METHOD => "unknown method",
        DEADLINE_EXCEEDED => "deadline exceeded",
        OVERLOADED => "overloaded",
        INTERNAL => "internal error",
        SHUTTING_DOWN => "shutting down",
        BAD_FRAME => "bad frame",
        UNAUTHENTICATED => "unauthenticated",
        c if (FS_STATUS_BASE..FS_STATUS_BASE + FS_STATUS_BLOCK_LEN).contains(&c) => {
            "file-system error"
        }
        c if c >= SERVICE_BASE => "service error",
        _ => "unknown transport status",
    }
}

/// Whether a call that got this status may be sent again unchanged (for idempotent calls).
pub fn is_retryable(code: u16) -> bool {
    matches!(code, OVERLOADED | SHUTTING_DOWN)
        || fs_status_from_code(code) == Some(FsStatus::Unavailable)
}

/// The status code carrying a file-system error (the rule lives in `stria_proto::wire`).
pub fn fs_status_code(status: FsStatus) -> u16 {
    status.rpc_code()
}

/// The file-system error a status code carries, if it is one.
pub fn fs_status_from_code(code: u16) -> Option<FsStatus> {
    FsStatus::from_rpc_code(code)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn fs_codes_round_trip_and_are_dense() {
        for n in 1..=FsStatus::ALL.len() as u16 {
            let code = FS_STATUS_BASE + n;
            let status = fs_status_from_code(code).expect("every FsStatus number maps");
            assert_eq!(fs_status_code(status), code);
        }
        assert_eq!(fs_status_code(FsStatus::NotFound), 3001);
        assert_eq!(fs_status_from_code(FS_STATUS_BASE), None);
        assert_eq!(fs_status_from_code(OK), None);
        assert_eq!(fs_status_from_code(UNKNOWN_METHOD), None);
    }

    #[test]
    fn names_and_retry_rules() {
        assert_eq!(name(DEADLINE_EXCEEDED), "deadline exceeded");
        assert_eq!(name(3005), "file-system error");
        assert_eq!(name(1234), "service error");
        assert!(is_retryable(OVERLOADED));
        assert!(is_retryable(fs_status_code(FsStatus::Unavailable)));
        assert!(!is_retryable(BAD_REQUEST));
        assert!(!is_retryable(fs_status_code(FsStatus::NotFound)));
    }
}
