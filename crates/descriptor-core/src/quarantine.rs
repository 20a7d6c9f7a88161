//! [`Quarantine`]: the memory of exposures that ended without their peer's
//! word, on a backend that cannot cut the peer off, kept for a bounded time
//! and then freed ([`QuarantinePolicy`]).
//!
//! A passive operation (a readable, a writable) that is cancelled, dropped
//! or timed out before its peer notified completion revokes its exposure;
//! where revocation is not enforced
//! ([`RegistrationBackend::revocation_enforced`](crate::RegistrationBackend::revocation_enforced)
//! is false: NIXL), a peer that loaded the metadata may still READ or WRITE
//! the memory. Freeing it at once would hand memory that a peer may still
//! write to the allocator; keeping it forever makes a worker that abandons
//! a few exposures an hour grow without bound. The quarantine keeps it for
//! [`QuarantinePolicy::hold`], then frees it (a pool's part goes back to
//! its pool). Decision record 0013 says why these defaults and what a late
//! peer can still do, per transport.

use std::collections::VecDeque;
use std::sync::PoisonError;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::metadata::OperationKind;
use crate::operation::Held;
use crate::sync::{Mutex, MutexGuard};

/// `NIXL_CONNECT_QUARANTINE_SECONDS`: [`QuarantinePolicy::hold`] in seconds
/// (a decimal number), or `forever`.
pub const ENV_QUARANTINE_SECONDS: &str = "NIXL_CONNECT_QUARANTINE_SECONDS";

/// `NIXL_CONNECT_QUARANTINE_READABLE_BYTES`: [`QuarantinePolicy::readable_bytes`].
pub const ENV_QUARANTINE_READABLE_BYTES: &str = "NIXL_CONNECT_QUARANTINE_READABLE_BYTES";

/// How long a connector keeps the memory of an exposure that ended without
/// its peer's notification, on a backend that cannot cut a peer off
/// ([`Connector::revocation_enforced`](crate::Connector::revocation_enforced)
/// is false), before it frees it.
///
/// - A **writable**'s memory is kept for [`hold`](Self::hold) after its
///   exposure was revoked, whatever the bytes: an honest peer's late WRITE
///   would otherwise land in memory the allocator gave to someone else.
/// - A **readable**'s memory is kept for `hold` too, but the oldest are freed
///   earlier whenever the readables kept exceed
///   [`readable_bytes`](Self::readable_bytes): an honest peer only READs a
///   readable, and a late READ of freed memory hands that peer wrong bytes
///   but changes nothing here.
///
/// The window is for honest peers whose transfer was already on its way:
/// after it, a peer that still holds the metadata reaches whatever the
/// memory holds then, as described per transport in decision record 0013.
/// [`forever`](Self::forever) keeps it for the connector's life (what this
/// library did before the quarantine existed).
///
/// The default is [`from_env`](Self::from_env): [`DEFAULT_HOLD`](Self::DEFAULT_HOLD)
/// and [`DEFAULT_READABLE_BYTES`](Self::DEFAULT_READABLE_BYTES) unless the
/// environment says otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuarantinePolicy {
    hold: Option<Duration>,
    readable_bytes: usize,
}

impl QuarantinePolicy {
    /// How long abandoned memory is kept by default: 5 s.
    pub const DEFAULT_HOLD: Duration = Duration::from_secs(5);

    /// How many bytes of abandoned readables are kept at most by default:
    /// 32 MiB.
    pub const DEFAULT_READABLE_BYTES: usize = 32 << 20;

    /// Keeps abandoned memory for `hold`, and at most `readable_bytes` of
    /// abandoned readables at once.
    pub const fn new(hold: Duration, readable_bytes: usize) -> QuarantinePolicy {
        QuarantinePolicy {
            hold: Some(hold),
            readable_bytes,
        }
    }

    /// Never frees abandoned memory: every exposure that ended without its
    /// peer's word keeps its memory for the life of the process.
    pub const fn forever() -> QuarantinePolicy {
        QuarantinePolicy {
            hold: None,
            readable_bytes: usize::MAX,
        }
    }

    /// The defaults, with [`ENV_QUARANTINE_SECONDS`] and
    /// [`ENV_QUARANTINE_READABLE_BYTES`] read when set. Err names the
    /// variable and what is wrong with its value.
    pub fn from_env() -> Result<QuarantinePolicy> {
        let read = |name: &str| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
        let mut policy = QuarantinePolicy::default_policy();
        if let Some(value) = read(ENV_QUARANTINE_SECONDS) {
            policy.hold = parse_hold(&value).map_err(|reason| Error::InvalidSetting {
                setting: ENV_QUARANTINE_SECONDS.to_owned(),
                value,
                reason,
            })?;
        }
        if let Some(value) = read(ENV_QUARANTINE_READABLE_BYTES) {
            policy.readable_bytes = value.trim().parse().map_err(|_| Error::InvalidSetting {
                setting: ENV_QUARANTINE_READABLE_BYTES.to_owned(),
                value,
                reason: "not a whole number of bytes",
            })?;
        }
        Ok(policy)
    }

    /// This policy with abandoned memory kept for `hold` (`None`: forever).
    pub const fn with_hold(mut self, hold: Option<Duration>) -> QuarantinePolicy {
        self.hold = hold;
        self
    }

    /// This policy with at most `bytes` of abandoned readables kept at once.
    pub const fn with_readable_bytes(mut self, bytes: usize) -> QuarantinePolicy {
        self.readable_bytes = bytes;
        self
    }

    const fn default_policy() -> QuarantinePolicy {
        QuarantinePolicy::new(Self::DEFAULT_HOLD, Self::DEFAULT_READABLE_BYTES)
    }

    /// How long abandoned memory is kept; `None`: forever.
    pub fn hold(&self) -> Option<Duration> {
        self.hold
    }

    /// The most bytes of abandoned readables kept at once.
    pub fn readable_bytes(&self) -> usize {
        self.readable_bytes
    }
}

impl Default for QuarantinePolicy {
    /// [`QuarantinePolicy::from_env`]; an invalid variable is logged (a
    /// warning) and the defaults are used.
    fn default() -> QuarantinePolicy {
        QuarantinePolicy::from_env().unwrap_or_else(|error| {
            tracing::warn!(%error, "using the default quarantine");
            QuarantinePolicy::default_policy()
        })
    }
}

/// Seconds as a decimal number, or `forever`.
fn parse_hold(value: &str) -> std::result::Result<Option<Duration>, &'static str> {
    let value = value.trim();
    if value.eq_ignore_ascii_case("forever") {
        return Ok(None);
    }
    let seconds: f64 = value
        .parse()
        .map_err(|_| "not a number of seconds or `forever`")?;
    Duration::try_from_secs_f64(seconds)
        .map(Some)
        .map_err(|_| "not a finite, non-negative number of seconds")
}

/// What a connector's quarantine holds now ([`Connector::quarantined`](crate::Connector::quarantined)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Quarantined {
    /// Abandoned exposures whose memory is kept.
    pub exposures: usize,
    /// Their bytes, readables and writables together.
    pub bytes: usize,
    /// The readables' part of `bytes`.
    pub readable_bytes: usize,
}

/// One abandoned exposure's descriptors.
struct Entry {
    held: Held,
    /// When it may be freed; `None`: never.
    until: Option<Instant>,
    bytes: usize,
    readable: bool,
}

/// A connector's abandoned memory, oldest first.
pub(crate) struct Quarantine {
    policy: QuarantinePolicy,
    ward: Mutex<Ward>,
}

#[derive(Default)]
struct Ward {
    /// In the order they came in; with one `hold`, also by `until`.
    entries: VecDeque<Entry>,
    held: Quarantined,
}

impl Quarantine {
    pub(crate) fn new(policy: QuarantinePolicy) -> Quarantine {
        Quarantine {
            policy,
            ward: Mutex::new(Ward::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Ward> {
        // Only counters and `Held`s change under the lock: never inconsistent.
        self.ward.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What it holds now.
    pub(crate) fn held(&self) -> Quarantined {
        self.lock().held
    }

    /// Takes the descriptors of an exposure of `kind` whose peer may still
    /// touch them, and frees what is due (this one too, if the readables'
    /// budget says so).
    pub(crate) fn admit(&self, held: Held, kind: OperationKind) {
        if held.is_empty() {
            return;
        }
        let bytes = held.iter().map(|d| d.capacity()).sum();
        let readable = kind == OperationKind::Read;
        let until = self.policy.hold.map(|hold| Instant::now() + hold);
        tracing::debug!(
            bytes,
            ?kind,
            ?until,
            "quarantined the memory of an abandoned exposure"
        );
        let due = {
            let mut ward = self.lock();
            ward.held.exposures += 1;
            ward.held.bytes += bytes;
            if readable {
                ward.held.readable_bytes += bytes;
            }
            ward.entries.push_back(Entry {
                held,
                until,
                bytes,
                readable,
            });
            self.take_due(&mut ward, Instant::now())
        };
        free(due);
    }

    /// Frees what is due now.
    pub(crate) fn sweep(&self) {
        let due = {
            let mut ward = self.lock();
            if ward.entries.is_empty() {
                return;
            }
            self.take_due(&mut ward, Instant::now())
        };
        free(due);
    }

    /// Frees everything it holds; returns what that was.
    pub(crate) fn free_all(&self) -> Quarantined {
        let ward = std::mem::take(&mut *self.lock());
        free(ward.entries.into_iter().map(|e| e.held).collect());
        ward.held
    }

    /// Takes out, under the lock, what may be freed at `now`: entries whose
    /// time passed, then the oldest readables while the readables exceed
    /// their budget. Freed by the caller after the lock (dropping
    /// descriptors calls the backend to deregister).
    fn take_due(&self, ward: &mut Ward, now: Instant) -> Vec<Held> {
        let mut due = Vec::new();
        let mut i = 0;
        while i < ward.entries.len() {
            let entry = &ward.entries[i];
            let expired = entry.until.is_some_and(|until| until <= now);
            let over_budget =
                entry.readable && ward.held.readable_bytes > self.policy.readable_bytes;
            if expired || over_budget {
                if let Some(entry) = ward.entries.remove(i) {
                    ward.held.exposures -= 1;
                    ward.held.bytes -= entry.bytes;
                    if entry.readable {
                        ward.held.readable_bytes -= entry.bytes;
                    }
                    due.push(entry.held);
                }
                continue;
            }
            // Entries are in order of `until`: once one is not due by time,
            // only the budget can free later ones.
            if ward.held.readable_bytes <= self.policy.readable_bytes {
                break;
            }
            i += 1;
        }
        due
    }
}

impl Drop for Quarantine {
    /// What is not due yet is leaked (with an error in the log), as before
    /// the quarantine: the connector is gone, and nothing would free it later.
    fn drop(&mut self) {
        let ward = std::mem::take(&mut *self.lock());
        let (due, kept): (Vec<Entry>, Vec<Entry>) = ward
            .entries
            .into_iter()
            .partition(|e| e.until.is_some_and(|until| until <= Instant::now()));
        free(due.into_iter().map(|e| e.held).collect());
        drop(kept);
    }
}

/// Frees quarantined descriptors: their peers' window is over.
fn free(due: Vec<Held>) {
    for held in due {
        drop(held.release());
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn hold_parses_seconds_and_forever_and_refuses_the_rest() {
        assert_eq!(parse_hold("2.5"), Ok(Some(Duration::from_millis(2500))));
        assert_eq!(parse_hold(" 0 "), Ok(Some(Duration::ZERO)));
        assert_eq!(parse_hold("Forever"), Ok(None));
        assert!(parse_hold("-1").is_err());
        assert!(parse_hold("inf").is_err());
        assert!(parse_hold("NaN").is_err());
        assert!(parse_hold("5s").is_err());
    }

    #[test]
    fn forever_keeps_everything_and_new_keeps_what_it_is_given() {
        let forever = QuarantinePolicy::forever();
        assert_eq!(forever.hold(), None);
        assert_eq!(forever.readable_bytes(), usize::MAX);
        let p = QuarantinePolicy::new(Duration::from_secs(1), 10);
        assert_eq!(p.hold(), Some(Duration::from_secs(1)));
        assert_eq!(p.readable_bytes(), 10);
    }
}
