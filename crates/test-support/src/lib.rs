//! Helpers shared by this workspace's tests, benchmarks and examples, so each
//! lives once: deterministic test bytes, checksums, resident memory, bounded
//! waits, child processes that speak lines, and two network namespaces as two
//! hosts. Not published; not an API.
//!
//! The helpers the conformance suite needs too (test bytes, bounded waits,
//! resident memory) live in descriptor-core (`conformance`, `testing`), since
//! this crate depends on it; they are re-exported here, so each has one copy.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use descriptor_core::Descriptor;

/// Deterministic test bytes (the conformance suite's, so every test, benchmark
/// and peer process agrees on them).
pub use descriptor_core::conformance::pattern;
/// Bounded waits (a hang fails the test) and resident memory.
pub use descriptor_core::testing::{BOUND, eventually, rss_bytes, within};

mod hosts;
pub use hosts::{Host, Hosts};

#[cfg(feature = "nixl")]
mod nixl;
#[cfg(feature = "nixl")]
pub use nixl::{Nixl, nixl_connector, runtime_available};

/// CRC-32 (zlib's, as Python's `zlib.crc32` computes it) of `bytes`.
pub fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = flate2::Crc::new();
    crc.update(bytes);
    crc.sum()
}

/// CRC-32 of host descriptors' bytes, in order.
pub fn crc32_of(descriptors: &[Descriptor]) -> u32 {
    let mut crc = flate2::Crc::new();
    for d in descriptors {
        crc.update(d.as_slice().expect("host descriptors"));
    }
    crc.sum()
}

/// A child process speaking lines on stdin/stdout, killed when dropped.
pub struct Peer {
    child: Child,
    lines: Receiver<String>,
    stdin: Option<ChildStdin>,
}

impl Peer {
    /// Starts `command` with piped stdin and stdout (stderr inherited).
    pub fn spawn(mut command: Command) -> Peer {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Peer {
            child,
            lines,
            stdin,
        }
    }

    /// The next line the peer prints, failing the test after `timeout`.
    pub fn line(&self, timeout: Duration) -> String {
        self.lines
            .recv_timeout(timeout)
            .unwrap_or_else(|e| panic!("the peer printed nothing within {timeout:?}: {e}"))
    }

    /// After the peer exited: the next line it printed that was not read
    /// yet, `None` once all were read.
    pub fn leftover_line(&self) -> Option<String> {
        self.lines.recv().ok()
    }

    /// Writes `line` to the peer's stdin.
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    /// Kills the process now (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Closes its stdin and waits for a clean exit.
    pub fn finish(mut self) {
        drop(self.stdin.take());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "peer exited with {status}");
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
