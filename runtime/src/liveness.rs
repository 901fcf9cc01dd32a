//! Whether a background worker (the dispatcher task, the receiver's writer
//! thread) is running, for `GET /_rf/readyz`.
//!
//! The worker holds a [`LivenessGuard`]; dropping it (the worker ended,
//! panicked or was aborted) marks it dead. Its owner marks it stopping as
//! soon as a shutdown starts, so a service stops being ready before it
//! stops working. Reading costs one atomic load; nothing here blocks.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A shareable view of one worker's state. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Liveness {
    alive: Arc<AtomicBool>,
}

/// Held by the worker for as long as it runs.
#[derive(Debug)]
pub struct LivenessGuard {
    alive: Arc<AtomicBool>,
}

impl Liveness {
    /// A live worker's view and the guard it must hold.
    pub fn start() -> (Liveness, LivenessGuard) {
        let alive = Arc::new(AtomicBool::new(true));
        (
            Liveness {
                alive: Arc::clone(&alive),
            },
            LivenessGuard { alive },
        )
    }

    /// True while the worker runs and no shutdown has started.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Marks the worker as stopping (it may still finish work in flight).
    pub fn stop(&self) {
        self.alive.store(false, Ordering::Release);
    }
}

impl Drop for LivenessGuard {
    fn drop(&mut self) {
        self.alive.store(false, Ordering::Release);
    }
}
