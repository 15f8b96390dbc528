//! The hand-off between submitters and a file device's worker thread(s): a bounded FIFO of
//! requests, each carrying the [`Completer`] that will finish its ticket.
//!
//! It owns ordering and backpressure only. It must never perform I/O or complete a request
//! itself, except by dropping it (which abandons the ticket) once the device is stopping.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use crate::{Completer, IoOp};

/// Requests a device accepts before `submit` waits for its workers to take some. Callers bound
/// their own in-flight work; this only stops a runaway submitter from queueing without limit.
pub(crate) const QUEUED_REQUESTS_MAX: usize = 4096;

/// One accepted request: what to do, who to tell, and when the caller asked (latency is measured
/// from here, so it includes time spent queued behind other requests, as the caller saw it).
#[derive(Debug)]
pub(crate) struct Request {
    pub(crate) op: IoOp,
    pub(crate) completer: Completer,
    pub(crate) started: Instant,
}

#[derive(Debug, Default)]
struct QueueState {
    requests: VecDeque<Request>,
    stopping: bool,
}

#[derive(Debug, Default)]
pub(crate) struct RequestQueue {
    state: Mutex<QueueState>,
    /// Signalled when the queue drops below its limit, or stops.
    space: Condvar,
    /// Signalled when a request arrives, or the queue stops (thread-pool workers sleep on it).
    work: Condvar,
}

/// What a non-blocking take found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Taken {
    /// Requests were moved out (possibly none) and the queue is now empty.
    Drained,
    /// Requests were moved out and more are waiting.
    More,
    /// The device is stopping: no more requests will come.
    Stopping,
}

impl RequestQueue {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a request, waiting while the queue is full. Returns whether the queue was empty,
    /// i.e. whether a consumer that only looks when woken needs waking. A request pushed after
    /// [`RequestQueue::stop`] is dropped, which completes its ticket as abandoned.
    pub(crate) fn push(&self, request: Request) -> bool {
        let mut state = self.lock();
        while state.requests.len() >= QUEUED_REQUESTS_MAX && !state.stopping {
            state = self.space.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        if state.stopping {
            drop(state);
            drop(request);
            return false;
        }
        let was_empty = state.requests.is_empty();
        state.requests.push_back(request);
        drop(state);
        self.work.notify_one();
        was_empty
    }

    /// Moves up to `max` requests into `out` without waiting.
    pub(crate) fn take(&self, max: usize, out: &mut Vec<Request>) -> Taken {
        let mut state = self.lock();
        if state.stopping {
            return Taken::Stopping;
        }
        let was_full = state.requests.len() >= QUEUED_REQUESTS_MAX;
        let count = max.min(state.requests.len());
        out.extend(state.requests.drain(..count));
        let more = !state.requests.is_empty();
        drop(state);
        if was_full && count > 0 {
            self.space.notify_all();
        }
        if more { Taken::More } else { Taken::Drained }
    }

    /// Waits for one request; `None` once the queue is stopping.
    pub(crate) fn take_one_waiting(&self) -> Option<Request> {
        let mut state = self.lock();
        loop {
            if state.stopping {
                return None;
            }
            if let Some(request) = state.requests.pop_front() {
                let was_full = state.requests.len() + 1 >= QUEUED_REQUESTS_MAX;
                drop(state);
                if was_full {
                    self.space.notify_all();
                }
                return Some(request);
            }
            state = self.work.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Stops the queue: every queued request is abandoned (its ticket fails with
    /// `IoError::Abandoned`) and later pushes are refused the same way.
    pub(crate) fn stop(&self) {
        let abandoned = {
            let mut state = self.lock();
            state.stopping = true;
            std::mem::take(&mut state.requests)
        };
        self.space.notify_all();
        self.work.notify_all();
        // Dropped outside the lock: each drop wakes a waiter that may want the lock.
        drop(abandoned);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{IoError, IoTicket};

    fn request(offset: u64) -> (IoTicket, Request) {
        let (ticket, completer) = IoTicket::pending("q0");
        (
            ticket,
            Request { op: IoOp::Read { offset, len: 4096 }, completer, started: Instant::now() },
        )
    }

    #[test]
    fn take_reports_whether_requests_remain_and_stop_abandons_them() {
        let queue = RequestQueue::default();
        let (_t0, r0) = request(0);
        let (_t1, r1) = request(4096);
        let (t2, r2) = request(8192);
        assert!(queue.push(r0), "first push finds the queue empty");
        assert!(!queue.push(r1));
        assert!(!queue.push(r2));
        let mut out = Vec::new();
        assert_eq!(queue.take(2, &mut out), Taken::More);
        assert_eq!(out.len(), 2);
        queue.stop();
        assert!(matches!(t2.wait(), Err(IoError::Abandoned { .. })));
        assert_eq!(queue.take(8, &mut out), Taken::Stopping);
        let (t3, r3) = request(0);
        assert!(!queue.push(r3));
        assert!(matches!(t3.wait(), Err(IoError::Abandoned { .. })));
    }
}
