//! Shared by the NIXL integration tests: the runtime gate and a harness.
#![allow(dead_code, clippy::unwrap_used, clippy::panic, clippy::print_stderr)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use backend_nixl::{MetadataScope, NixlBackend};
use descriptor_core::Connector;
use descriptor_core::conformance::Harness;

/// True when the NIXL runtime is loaded. Without it a test is skipped with a
/// message, unless `NIXL_TESTS_REQUIRED` is set (as `cargo xtask test` does):
/// then a missing runtime fails the test.
pub(crate) fn runtime_available() -> bool {
    match backend_nixl::runtime::load() {
        Ok(_) => true,
        Err(e) if std::env::var_os("NIXL_TESTS_REQUIRED").is_some() => {
            panic!("NIXL_TESTS_REQUIRED is set but the runtime is unavailable: {e}")
        }
        Err(e) => {
            eprintln!(
                "SKIPPED: NIXL runtime unavailable ({e}); run `cargo xtask test` to provision it"
            );
            false
        }
    }
}

/// Makes NIXL connectors with names unique in the process.
pub(crate) struct Nixl {
    prefix: String,
    scope: MetadataScope,
}

impl Nixl {
    pub(crate) fn new(scope: MetadataScope) -> Nixl {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        Nixl {
            prefix: format!(
                "t{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ),
            scope,
        }
    }
}

impl Harness for Nixl {
    fn connector(&self, name: &str) -> Connector {
        let backend = NixlBackend::builder(&format!("{}-{name}", self.prefix))
            .metadata_scope(self.scope)
            .build()
            .unwrap();
        Connector::new(backend)
    }

    fn delay_next_transfer(&self, _name: &str, _delay: Duration) -> bool {
        false
    }
}

/// CRC-32 of the descriptors' bytes, in order (zlib's, as Python computes it).
pub(crate) fn crc32(descriptors: &[descriptor_core::Descriptor]) -> u32 {
    let mut crc = flate2::Crc::new();
    for d in descriptors {
        crc.update(d.as_slice().unwrap());
    }
    crc.sum()
}

/// A child process speaking lines on stdin/stdout, killed when dropped.
pub(crate) struct Peer {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    stdin: Option<std::process::ChildStdin>,
}

impl Peer {
    pub(crate) fn spawn(mut command: std::process::Command) -> Peer {
        use std::io::BufRead;
        use std::process::Stdio;
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
    pub(crate) fn line(&self, timeout: Duration) -> String {
        self.lines
            .recv_timeout(timeout)
            .unwrap_or_else(|e| panic!("the peer printed nothing within {timeout:?}: {e}"))
    }

    pub(crate) fn send(&mut self, line: &str) {
        use std::io::Write;
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    /// Kills the process now (SIGKILL) and reaps it.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for a clean exit.
    pub(crate) fn finish(mut self) {
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
