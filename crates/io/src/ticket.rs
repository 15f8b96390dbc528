//! Completion tickets: how a submitter waits for a request that another thread (an io_uring
//! reaper, a pool worker) completes.

use std::sync::{Arc, Condvar, Mutex};

use crate::{IoDone, IoError};

type Outcome = Result<IoDone, IoError>;

/// Runs once with the outcome, on the thread that completes the request, before the waiter sees
/// it. Hooks must be quick and must not block: on a file device they run on the io_uring thread.
type Hook = Box<dyn FnOnce(&mut Outcome) + Send>;

#[derive(Debug, Default)]
struct Slot {
    state: Mutex<SlotState>,
    ready: Condvar,
}

#[derive(Default)]
struct SlotState {
    outcome: Option<Outcome>,
    hook: Option<Hook>,
}

impl std::fmt::Debug for SlotState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotState")
            .field("outcome", &self.outcome)
            .field("hook", &self.hook.as_ref().map(|_| "set"))
            .finish()
    }
}

impl Slot {
    fn finish(&self, mut outcome: Outcome) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(hook) = state.hook.take() {
            hook(&mut outcome);
        }
        state.outcome = Some(outcome);
        self.ready.notify_one();
    }
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
                let mut guard = slot.state.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    if let Some(outcome) = guard.outcome.take() {
                        return outcome;
                    }
                    guard = slot.ready.wait(guard).unwrap_or_else(|e| e.into_inner());
                }
            }
        }
    }

    /// Arranges for `hook` to see (and possibly change) the outcome when the request completes,
    /// or now if it already has. Wrapping devices use this to count and alter results without a
    /// thread of their own. The hook runs on the completing thread, so it must be quick and must
    /// never block; hooks added to one ticket run in the order they were added.
    pub fn on_complete(self, hook: impl FnOnce(&mut Outcome) + Send + 'static) -> IoTicket {
        match self.0 {
            Inner::Ready(mut outcome) => {
                hook(&mut outcome);
                IoTicket(Inner::Ready(outcome))
            }
            Inner::Pending(slot) => {
                {
                    let mut state = slot.state.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(outcome) = state.outcome.as_mut() {
                        hook(outcome);
                    } else {
                        state.hook = Some(match state.hook.take() {
                            None => Box::new(hook),
                            Some(earlier) => Box::new(move |outcome: &mut Outcome| {
                                earlier(outcome);
                                hook(outcome);
                            }),
                        });
                    }
                }
                IoTicket(Inner::Pending(slot))
            }
        }
    }
}

impl Completer {
    pub fn complete(mut self, outcome: Outcome) {
        if let Some(slot) = self.slot.take() {
            slot.finish(outcome);
        }
    }
}

impl Drop for Completer {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            let device = std::mem::take(&mut self.device);
            slot.finish(Err(IoError::Abandoned { device }));
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
    fn hooks_see_the_outcome_once_whether_added_before_or_after_completion() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let calls = Arc::new(AtomicUsize::new(0));

        let (ticket, completer) = IoTicket::pending("d0");
        let counted = calls.clone();
        let ticket = ticket.on_complete(move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
        });
        // A second hook runs after the first and may replace the outcome.
        let ticket = ticket.on_complete(|outcome| {
            *outcome = Err(IoError::Injected { device: "d0".into(), offset: 0 })
        });
        std::thread::spawn(move || completer.complete(Ok(IoDone::Done)));
        assert!(matches!(ticket.wait(), Err(IoError::Injected { .. })));
        assert_eq!(calls.load(Ordering::SeqCst), 1);

        let (ticket, completer) = IoTicket::pending("d0");
        completer.complete(Ok(IoDone::Done));
        let counted = calls.clone();
        let ticket = ticket.on_complete(move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
        });
        assert!(matches!(ticket.wait(), Ok(IoDone::Done)));
        assert_eq!(calls.load(Ordering::SeqCst), 2);

        // Abandoned requests pass through hooks too, so wrappers count them as errors.
        let (ticket, completer) = IoTicket::pending("d0");
        let counted = calls.clone();
        let ticket = ticket.on_complete(move |outcome| {
            assert!(outcome.is_err());
            counted.fetch_add(1, Ordering::SeqCst);
        });
        drop(completer);
        assert!(matches!(ticket.wait(), Err(IoError::Abandoned { .. })));
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn completion_from_another_thread_reaches_the_waiter() {
        let (ticket, completer) = IoTicket::pending("d0");
        std::thread::spawn(move || completer.complete(Ok(IoDone::Done)));
        assert!(matches!(ticket.wait(), Ok(IoDone::Done)));
    }
}
