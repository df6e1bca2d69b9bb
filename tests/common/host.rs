//! The machine, shared by the tests of one binary that run at once. Most tests only add their
//! own containers beside the others' and look at their own; a test that judges the whole host
//! (e.g. a `serve` with no private root whose descriptors and RSS must stay flat while it
//! scans) takes the host `alone()`: no other test of this process runs beside it, and none of
//! their containers is left.
//!
//! Shared holds are taken by `e2e_available()` for the rest of the calling test (its thread)
//! and by every `Container` for its life. Readers first, not a std RwLock: a shared hold taken
//! while another is held (a test's second container, a helper thread's) never waits, so no test
//! can deadlock against a waiting `alone()`, which runs once the shared holds are all gone.

use std::cell::{Cell, RefCell};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

struct Holds {
    shared: usize,
    alone: bool,
}

static HOLDS: Mutex<Holds> = Mutex::new(Holds {
    shared: 0,
    alone: false,
});
static CHANGED: Condvar = Condvar::new();

thread_local! {
    /// This thread holds the host alone: its own shared holds are no-ops.
    static ALONE_HERE: Cell<bool> = const { Cell::new(false) };
    /// What the test on this thread holds until the thread ends (a panic included).
    static TEST_HOLD: RefCell<Option<Hold>> = const { RefCell::new(None) };
}

enum Hold {
    Shared(#[allow(dead_code)] Shared),
    Alone,
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Hold::Alone = self {
            holds().alone = false;
            CHANGED.notify_all();
        }
    }
}

fn holds() -> MutexGuard<'static, Holds> {
    // A test that panicked holding the mutex left the counts right: they change in one step.
    HOLDS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A shared hold of the host, released on drop.
pub struct Shared {
    counted: bool,
}

impl Drop for Shared {
    fn drop(&mut self) {
        if self.counted {
            holds().shared -= 1;
            CHANGED.notify_all();
        }
    }
}

/// Waits while some test holds the host alone (unless it is this thread).
pub fn share() -> Shared {
    if ALONE_HERE.with(Cell::get) {
        return Shared { counted: false };
    }
    let mut h = holds();
    while h.alone {
        h = CHANGED.wait(h).unwrap_or_else(PoisonError::into_inner);
    }
    h.shared += 1;
    Shared { counted: true }
}

/// A shared hold for the rest of the calling test (its thread); once per test.
pub fn for_this_test() {
    TEST_HOLD.with(|held| {
        let mut held = held.borrow_mut();
        if held.is_none() {
            *held = Some(Hold::Shared(share()));
        }
    });
}

/// The host for this test alone, until its thread ends. Call it first, before
/// `e2e_available()` or any container.
pub fn alone() {
    assert!(
        TEST_HOLD.with(|held| held.borrow().is_none()),
        "host::alone() must come before anything that shares the host"
    );
    let mut h = holds();
    while h.alone || h.shared > 0 {
        h = CHANGED.wait(h).unwrap_or_else(PoisonError::into_inner);
    }
    h.alone = true;
    drop(h);
    ALONE_HERE.with(|a| a.set(true));
    TEST_HOLD.with(|held| *held.borrow_mut() = Some(Hold::Alone));
}
