//! Completion tickets: how a submitter waits for a request that another thread (an io_uring
//! reaper, a pool worker) completes.

use std::sync::{Arc, Condvar, Mutex};

use crate::{IoDone, IoError};

type Outcome = Result<IoDone, IoError>;

#[derive(Debug, Default)]
struct Slot {
    outcome: Mutex<Option<Outcome>>,
    ready: Condvar,
}

/// The submitter's half: wait for the outcome.
#[derive(Debug)]
pub struct IoTicket(Inner);

#[derive(Debug)]
enum Inner {
    Ready(Outcome),
    Pending(Arc<Slot>),
}

/// The completer's half. Dropping it without calling [`Completer::complete`] completes the
/// request with [`IoError::Abandoned`], so no submitter ever waits forever on a dead worker.
#[derive(Debug)]
pub struct Completer {
    slot: Option<Arc<Slot>>,
    device: String,
}

impl IoTicket {
    /// A ticket for a request that finished during `submit` (memory devices, rejected requests).
    pub fn ready(outcome: Outcome) -> IoTicket {
        IoTicket(Inner::Ready(outcome))
    }

    /// A ticket and the completer that will finish it.
    pub fn pending(device: &str) -> (IoTicket, Completer) {
        let slot = Arc::new(Slot::default());
        (
            IoTicket(Inner::Pending(slot.clone())),
            Completer { slot: Some(slot), device: device.to_string() },
        )
    }

    pub fn wait(self) -> Outcome {
        match self.0 {
            Inner::Ready(outcome) => outcome,
            Inner::Pending(slot) => {
                let mut guard = slot.outcome.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    if let Some(outcome) = guard.take() {
                        return outcome;
                    }
                    guard = slot.ready.wait(guard).unwrap_or_else(|e| e.into_inner());
                }
            }
        }
    }
}

impl Completer {
    pub fn complete(mut self, outcome: Outcome) {
        if let Some(slot) = self.slot.take() {
            *slot.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome);
            slot.ready.notify_one();
        }
    }
}

impl Drop for Completer {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            let device = std::mem::take(&mut self.device);
            *slot.outcome.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(Err(IoError::Abandoned { device }));
            slot.ready.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_completer_abandons_the_request() {
        let (ticket, completer) = IoTicket::pending("d0");
        std::thread::spawn(move || drop(completer));
        assert!(matches!(ticket.wait(), Err(IoError::Abandoned { .. })));
    }

    #[test]
    fn completion_from_another_thread_reaches_the_waiter() {
        let (ticket, completer) = IoTicket::pending("d0");
        std::thread::spawn(move || completer.complete(Ok(IoDone::Done)));
        assert!(matches!(ticket.wait(), Ok(IoDone::Done)));
    }
}
