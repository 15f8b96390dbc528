//! Ctrl-C handling: the first SIGINT or SIGTERM asks the running command to stop at its next
//! safe point (between pieces of a transfer, stripes of a scrub, cells of a benchmark) so it can
//! still close the array cleanly and remove its scratch files; a second one exits at once.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// The exit status a shell reports for a process ended by SIGINT.
const EXIT_INTERRUPTED: libc::c_int = 130;

extern "C" fn on_signal(_signal: libc::c_int) {
    if REQUESTED.swap(true, Relaxed) {
        // SAFETY: _exit is async-signal-safe and never returns.
        unsafe { libc::_exit(EXIT_INTERRUPTED) };
    }
}

/// Installs the handler for SIGINT and SIGTERM.
pub fn install() {
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only touches an atomic and calls _exit, both allowed in a signal
        // handler; signal() itself has no memory-safety preconditions.
        unsafe { libc::signal(signal, handler) };
    }
}

/// True once the user asked the command to stop.
pub fn requested() -> bool {
    REQUESTED.load(Relaxed)
}

/// The flag itself, for APIs that poll an `AtomicBool` (scrub).
pub fn flag() -> &'static AtomicBool {
    &REQUESTED
}
