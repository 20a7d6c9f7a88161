//! [`Held`]: descriptors a backend may still touch.

use crate::descriptor::Descriptor;

/// Descriptors an operation holds while a transfer or a peer may touch their
/// memory. Dropping a `Held` *leaks* them; only [`Held::release`], called once
/// the backend has let go, gives them back. So whatever unwinds through the
/// code that holds one (a panicking backend, waker or hook), the memory is never
/// freed early: the worst a panic can do is leak it.
#[derive(Default)]
pub(crate) struct Held(Vec<Descriptor>);

impl Held {
    pub(crate) fn new(descriptors: Vec<Descriptor>) -> Held {
        Held(descriptors)
    }

    /// Gives the descriptors back. Call only once the backend no longer touches
    /// their memory.
    pub(crate) fn release(mut self) -> Vec<Descriptor> {
        std::mem::take(&mut self.0)
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn iter(&self) -> std::slice::Iter<'_, Descriptor> {
        self.0.iter()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        let bytes: usize = self.0.iter().map(Descriptor::size).sum();
        tracing::error!(
            descriptors = self.0.len(),
            bytes,
            "a peer or the backend may still touch this memory: leaking it instead of freeing it"
        );
        std::mem::forget(std::mem::take(&mut self.0));
    }
}
