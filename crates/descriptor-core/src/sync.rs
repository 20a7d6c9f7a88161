//! The synchronisation primitives of the operation state machine, the
//! engine's notification hand-off, the remote-peer cache and registered
//! regions, swapped for `loom`'s when the crate is built with `--cfg loom`,
//! so that the models in `operation/loom.rs` and `region/loom.rs` explore
//! every interleaving of the real code (what tokio does with its
//! `crate::loom` module).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering, fence};
#[cfg(loom)]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::OnceLock;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering, fence};
#[cfg(not(loom))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};

#[cfg(loom)]
pub(crate) use self::loom_once::OnceLock;

/// The part of `std::sync::OnceLock` a region's registration uses (`new`,
/// `get`, `set`, `take`), on a loom atomic pointer so that the model sees
/// every publication and read of it.
#[cfg(loom)]
mod loom_once {
    use loom::sync::atomic::{AtomicPtr, Ordering};

    pub(crate) struct OnceLock<T> {
        value: AtomicPtr<T>,
    }

    impl<T> OnceLock<T> {
        pub(crate) fn new() -> OnceLock<T> {
            OnceLock {
                value: AtomicPtr::new(std::ptr::null_mut()),
            }
        }

        pub(crate) fn get(&self) -> Option<&T> {
            let value = self.value.load(Ordering::Acquire);
            // SAFETY: a non-null pointer came from `Box::into_raw` in `set`
            // and is freed only through `&mut self` (`take`, `drop`), so it
            // lives as long as this shared borrow.
            (!value.is_null()).then(|| unsafe { &*value })
        }

        pub(crate) fn set(&self, value: T) -> Result<(), T> {
            let boxed = Box::into_raw(Box::new(value));
            match self.value.compare_exchange(
                std::ptr::null_mut(),
                boxed,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => Ok(()),
                // SAFETY: `boxed` was not published: it is still ours alone.
                Err(_) => Err(*unsafe { Box::from_raw(boxed) }),
            }
        }

        pub(crate) fn take(&mut self) -> Option<T> {
            let value = self.value.swap(std::ptr::null_mut(), Ordering::AcqRel);
            // SAFETY: published by `set` with `Box::into_raw`, and swapped
            // out under `&mut self`: nobody else can reach it.
            (!value.is_null()).then(|| *unsafe { Box::from_raw(value) })
        }
    }

    impl<T> Drop for OnceLock<T> {
        fn drop(&mut self) {
            drop(self.take());
        }
    }
}
