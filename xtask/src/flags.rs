//! The command line of `cargo xtask`, declared with xflags (as rust-analyzer's
//! xtask does); `--help` on any command prints its part.

use std::path::PathBuf;

xflags::xflags! {
    /// Project automation for nixl-connect.
    cmd xtask {
        /// fmt check, clippy -D warnings, feature combinations, all tests and
        /// doc tests, loom, ASan, fuzz, rustdoc -D warnings, demos, the
        /// two-process example, the Python suite.
        cmd test {
            /// Only the steps whose names start with these (e.g. `python`,
            /// `clippy`, `fuzz`); all of them when none is given.
            repeated step: String
            /// The long load runs too: 16 x 10,000 loopback operations, 1 GiB kill tests.
            optional --long
            /// For a one-off run on a clean clone (CI does this): each step's
            /// own build folder (loom, ASan, fuzz, the wheel's) is removed
            /// once the step is done, nothing is built incrementally, and debug
            /// builds keep line tables only.
            optional --lean
            /// The development loop instead: fmt, clippy, unit tests, loopback
            /// conformance, the Python suite on loopback (3.11). CI runs the full set.
            optional --quick
        }
        /// The KV-cache pattern: one registered arena per side, many requests
        /// of runs and scattered blocks both ways, CRC-checked; requests/s,
        /// GB/s, p50/p99 (release build).
        cmd demo {
            /// loopback (the default) or nixl.
            optional --backend name: String
            /// Blocks in each side's arena (default 256).
            optional --blocks n: usize
            /// Bytes per block (default 65536).
            optional --block-size bytes: usize
            /// Requests to serve, each both ways (default 400).
            optional --iterations n: usize
            /// The storage tier: LRU blocks evicted to a file and read back.
            optional --offload
            /// Serve the transfer metrics at http://127.0.0.1:PORT/metrics
            /// while the demo runs (0: any free port), checked at the end.
            optional --metrics-port port: u16
        }
        /// memcpy / loopback / nixl / raw nixl-sys, in and across processes, then
        /// the criterion hot paths; writes target/bench/ and renders
        /// docs/performance.md from its report.json.
        cmd bench {
            /// Fewer sizes and iterations.
            optional --quick
            /// Only the Python package against Dynamo's module.
            optional --python
            /// Only the cross-process rows, across two network namespaces over TCP.
            optional --two-hosts
            /// Measure nothing: render docs/performance.md (and copy the
            /// report to docs/bench-report.json) from a report already written.
            optional --render-only
            /// With --render-only: the report (default target/bench/report.json).
            optional --report path: PathBuf
        }
        /// libFuzzer on the metadata, agent-blob and device parsers.
        cmd fuzz {
            /// Seconds per parser (default 60).
            optional --seconds n: u64
        }
        /// Release GPU checks and the NIXL runtime they need in target/gpu-bundle (run.sh).
        cmd gpu-bundle {}
        /// The mixed workload of issue 48 on NIXL (long-lived server and client,
        /// a peer restarted every 30 s, some abandoned operations, every byte
        /// checked), then target/soak/<impl>/report.{json,md} and its verdicts;
        /// fails when one fails.
        cmd soak {
            /// Minutes to run (default 10; the long suite runs 60).
            optional --minutes m: f64
            /// ours (the default), dyn (Dynamo 1.6.1's module), or both (ours
            /// gates, Dynamo's is the reference). Also spelled `--impl`.
            optional --module name: String
            /// Use the package target/py-venv holds now instead of building and
            /// installing the wheel first.
            optional --installed
            /// The bound on every process's peak RSS, MiB (default 1024).
            optional --rss-bound-mib n: u64
        }
        /// Fetch the NIXL runtime into target/nixl-runtime (idempotent).
        cmd nixl-runtime {}
        /// The Python package as one abi3 manylinux_2_28 wheel in target/wheels
        /// (maturin with zig), checked with auditwheel.
        cmd wheel {}
    }
}

impl Xtask {
    /// [`Xtask::from_env`], with `soak --impl` read as `soak --module` (the
    /// issue's spelling: xflags names each field after its flag, and `impl`
    /// is a keyword).
    pub(crate) fn from_env_with_aliases() -> xflags::Result<Xtask> {
        let mut args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
        if args.first().is_some_and(|a| a == "soak") {
            for a in &mut args {
                if a == "--impl" {
                    *a = "--module".into();
                }
            }
        }
        Xtask::from_vec(args)
    }
}

impl Bench {
    /// `--python` and `--two-hosts` pick different rows: one or the other.
    /// `--render-only` measures nothing: no other option but `--report`.
    pub(crate) fn validate(&self) -> xflags::Result<()> {
        if self.python && self.two_hosts {
            return Err(xflags::Error::new(
                "bench: --python and --two-hosts cannot be combined",
            ));
        }
        if self.render_only && (self.quick || self.python || self.two_hosts) {
            return Err(xflags::Error::new(
                "bench: --render-only measures nothing; it takes only --report",
            ));
        }
        if self.report.is_some() && !self.render_only {
            return Err(xflags::Error::new(
                "bench: --report names the report --render-only renders",
            ));
        }
        Ok(())
    }
}
