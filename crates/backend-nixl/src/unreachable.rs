//! Peers found unreachable, remembered for a while ([`Unreachable`]).
//!
//! NIXL 1.5.1 keeps a socket in UCX for every failed attempt to connect to
//! a peer that exited, and one more for the probe that tells such a peer
//! from a refused region (`is_unreachable` in [`crate::peers`]'s loader);
//! neither can be closed through NIXL (the names were never loaded, so
//! there is nothing to invalidate). A worker that retries a dead peer
//! would run out of file descriptors. So a peer's connection info found
//! unreachable is remembered, and loads of it within
//! [`Tuning::unreachable_for`] are refused at once, without asking UCX: a
//! dead peer costs two descriptors per that time, whatever the number of
//! retries.
//!
//! The key is the connection info itself (UCX: the worker address, new in
//! every process): a peer restarted under its name has another, and is
//! loaded at once.
//!
//! [`Tuning::unreachable_for`]: crate::Tuning::unreachable_for

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::agent_metadata::Conn;

/// The most connection infos remembered; past it the oldest is forgotten
/// (a connector that meets more dead peers than this within the window
/// pays their sockets again).
const CAPACITY: usize = 1024;

/// Connection infos that UCX could not connect to, and when.
#[derive(Debug)]
pub(crate) struct Unreachable {
    /// How long a refusal is remembered; zero: never.
    window: Duration,
    seen: HashMap<Vec<Conn>, Instant>,
}

impl Unreachable {
    pub(crate) fn new(window: Duration) -> Unreachable {
        Unreachable {
            window,
            seen: HashMap::new(),
        }
    }

    /// How long a refusal is remembered.
    pub(crate) fn window(&self) -> Duration {
        self.window
    }

    /// How long ago `conns` was found unreachable, if that is still
    /// remembered.
    pub(crate) fn since(&mut self, conns: &[Conn]) -> Option<Duration> {
        let at = *self.seen.get(conns)?;
        let ago = at.elapsed();
        if ago < self.window {
            Some(ago)
        } else {
            self.seen.remove(conns);
            None
        }
    }

    /// Remembers that UCX could not connect to `conns` just now.
    pub(crate) fn remember(&mut self, conns: &[Conn]) {
        if self.window.is_zero() {
            return;
        }
        if self.seen.len() >= CAPACITY && !self.seen.contains_key(conns) {
            let window = self.window;
            self.seen.retain(|_, at| at.elapsed() < window);
            if self.seen.len() >= CAPACITY
                && let Some(oldest) = self
                    .seen
                    .iter()
                    .min_by_key(|(_, at)| **at)
                    .map(|(k, _)| k.clone())
            {
                self.seen.remove(&oldest);
            }
        }
        self.seen.insert(conns.to_vec(), Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(info: u8) -> Vec<Conn> {
        vec![Conn {
            backend: "UCX".into(),
            info: vec![info; 16],
        }]
    }

    #[test]
    fn a_refusal_is_remembered_for_the_window_and_only_for_that_connection() {
        let mut u = Unreachable::new(Duration::from_secs(3600));
        assert_eq!(u.since(&conn(1)), None);
        u.remember(&conn(1));
        assert!(u.since(&conn(1)).is_some());
        assert_eq!(
            u.since(&conn(2)),
            None,
            "a restarted peer has other connection info"
        );
        let mut never = Unreachable::new(Duration::ZERO);
        never.remember(&conn(1));
        assert_eq!(
            never.since(&conn(1)),
            None,
            "a zero window remembers nothing"
        );
    }

    #[test]
    fn it_holds_at_most_its_capacity() {
        let mut u = Unreachable::new(Duration::from_secs(3600));
        for i in 0..CAPACITY + 10 {
            u.remember(&[Conn {
                backend: "UCX".into(),
                info: i.to_le_bytes().to_vec(),
            }]);
        }
        assert_eq!(u.seen.len(), CAPACITY);
    }
}
