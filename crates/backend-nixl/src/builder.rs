//! [`NixlBackendBuilder`]: plugins and their parameters, NIXL's progress
//! thread, thread sync, metadata scope, the notification route and the
//! timing knobs.
//!
//! [`NixlBackend::new`] and [`NixlBackend::builder`] are here, the
//! builder's entry points, so that `backend.rs` does not depend on the
//! builder: the builder makes the agents and hands them to
//! [`NixlBackend::from_agents`].

use std::time::Duration;

use descriptor_core::{Error, Result};
use nixl_sys::{Agent, AgentConfig, ThreadSync};

use crate::agents::{Agents, initiator_name};
use crate::backend::NixlBackend;
use crate::error::{NAME, nixl_error};
use crate::runtime;
use crate::scope::MetadataScope;
use crate::storage::{Storage, StorageState};
use crate::tuning::{Notifications, Tuning};

/// Builds a [`NixlBackend`]: transport plugins and their parameters, progress
/// thread, thread-sync mode, metadata scope, notification route and
/// [`Tuning`].
#[derive(Debug, Clone)]
pub struct NixlBackendBuilder {
    name: String,
    /// `None` until a plugin is named: then the default, UCX.
    plugins: Option<Vec<String>>,
    params: Vec<(String, String, String)>,
    progress_thread: bool,
    thread_sync: ThreadSync,
    scope: MetadataScope,
    notifications: Notifications,
    tuning: Tuning,
    log_level: Option<runtime::LogLevel>,
    storage: Storage,
    cached_reads: bool,
    buffered_writes: bool,
}

impl NixlBackend {
    /// An agent named `name` with the defaults: UCX, NIXL's progress thread
    /// (event-driven, with [`Tuning::progress_thread_delay`]), strict thread
    /// sync, [`MetadataScope::Agent`] metadata, notifications apart,
    /// [`Tuning::default`].
    pub fn new(name: &str) -> Result<NixlBackend> {
        NixlBackend::builder(name).build()
    }

    /// A builder for an agent named `name`.
    pub fn builder(name: &str) -> NixlBackendBuilder {
        NixlBackendBuilder {
            name: name.to_owned(),
            plugins: None,
            params: Vec::new(),
            progress_thread: true,
            thread_sync: ThreadSync::Strict,
            scope: MetadataScope::Agent,
            notifications: Notifications::Apart,
            tuning: Tuning::default(),
            log_level: None,
            storage: Storage::default(),
            cached_reads: true,
            buffered_writes: true,
        }
    }
}

impl NixlBackendBuilder {
    /// Adds a transport plugin (`"UCX"`, `"LIBFABRIC"`, `"POSIX"`, ...). The first
    /// call replaces the default, `["UCX"]`.
    pub fn plugin(mut self, plugin: &str) -> Self {
        let plugins = self.plugins.get_or_insert_with(Vec::new);
        if !plugins.iter().any(|p| p == plugin) {
            plugins.push(plugin.to_owned());
        }
        self
    }

    /// Sets a plugin parameter, e.g. `("UCX", "num_workers", "2")`, on top of the
    /// plugin's defaults; of two settings of one key, the later wins.
    /// [`build`](Self::build) refuses a parameter for a plugin the agent does
    /// not load.
    ///
    /// UCX's own variables are set per agent, without the environment,
    /// through the UCX plugin's `engine_config`: comma-separated `KEY=VALUE`
    /// pairs without the `UCX_` prefix, e.g. `("UCX", "engine_config",
    /// "USE_MT_MUTEX=y,RNDV_THRESH=8k")`. Give every pair in one call (a
    /// second call replaces the first); a variable set as `UCX_KEY` in the
    /// environment wins over its pair. NIXL 1.5 does not report an unknown
    /// key or an invalid value: UCX only logs an error, and the agent is
    /// built without it.
    pub fn plugin_param(mut self, plugin: &str, key: &str, value: &str) -> Self {
        self.params
            .push((plugin.to_owned(), key.to_owned(), value.to_owned()));
        self
    }

    /// Whether UCX must detect a peer that dies (default: yes, NIXL's own
    /// default). Sets UCX's `ucx_error_handling_mode`: `peer`, or `none` when
    /// `false`.
    ///
    /// With detection, UCX uses only transports that report a dead peer: on
    /// a host without RDMA devices, small transfers between processes are
    /// slower (notifications go over TCP loopback instead of shared memory).
    /// Only the initiator's setting counts. Without detection UCX does not
    /// promise that a transfer to a peer that dies ends at all: bound every
    /// wait (`wait_timeout`), and keep the default where peers can die
    /// without the job noticing. Why the default, with the numbers:
    /// docs/decisions/0005-peer-failure-detection-default.md.
    pub fn peer_failure_detection(self, detect: bool) -> Self {
        let mode = if detect { "peer" } else { "none" };
        self.plugin_param("UCX", "ucx_error_handling_mode", mode)
    }

    /// Whether NIXL runs its own progress thread (default: yes, with a
    /// delay: [`Tuning::progress_thread_delay`]). It is event-driven: it
    /// sleeps on UCX's event fd and wakes on traffic, so the agent serves
    /// peers even when it has nothing in flight itself. Without it, the
    /// agent progresses only while this backend's watcher polls (a transfer
    /// in flight, a passive operation waiting): a peer that reaches it at
    /// any other time waits until it does. Why:
    /// docs/decisions/0001-nixl-progress-thread-and-delay.md.
    ///
    /// With the thread on, the backend runs two NIXL agents: the one called
    /// by the builder's name, with the thread, holds the memory peers reach,
    /// receives their notifications and (see [`notifications`](Self::notifications))
    /// sends this connector's; this connector's own READs and WRITEs go out
    /// through a second one, `<name>.initiator`, without it, so that no
    /// NIXL thread contends for the posting worker's lock. Memory is
    /// registered with both, and a peer is loaded into both. Why:
    /// docs/decisions/0003-two-agents.md.
    pub fn progress_thread(mut self, enabled: bool) -> Self {
        self.progress_thread = enabled;
        self
    }

    /// The longest NIXL's progress thread, if enabled, sleeps waiting for
    /// traffic: sets [`Tuning::progress_thread_delay`] (default:
    /// [`Tuning::default`]'s).
    pub fn progress_thread_delay(mut self, delay: Duration) -> Self {
        self.tuning.progress_thread_delay = delay;
        self
    }

    /// How a transfer's notification travels (default
    /// [`Notifications::Apart`]); with NIXL's progress thread off there is
    /// one agent, and notifications are always attached.
    pub fn notifications(mut self, notifications: Notifications) -> Self {
        self.notifications = notifications;
        self
    }

    /// Every timing knob at once (default [`Tuning::default`]); replaces an
    /// earlier [`progress_thread_delay`](Self::progress_thread_delay).
    pub fn tuning(mut self, tuning: Tuning) -> Self {
        self.tuning = tuning;
        self
    }

    /// Sets the native layer's log level for the whole process when the agent
    /// is built (see [`runtime::set_log_level`]): NIXL's and UCX's;
    /// `LogLevel::Off` silences the `E...` lines NIXL prints for refused
    /// requests, whose reasons this crate's errors already carry, and UCX's
    /// `UCX  ERROR` lines. Default: NIXL's own (`NIXL_LOG_LEVEL`, or INFO) and
    /// UCX's (`UCX_LOG_LEVEL`, or warn). Either way UCX's lines go to stderr
    /// unless `UCX_LOG_FILE` says otherwise ([`runtime::LogLevel`]).
    pub fn log_level(mut self, level: runtime::LogLevel) -> Self {
        self.log_level = Some(level);
        self
    }

    /// NIXL's internal locking (default [`ThreadSync::Strict`]: the connector calls
    /// the agent from user threads and its progress engine at once).
    pub fn thread_sync(mut self, mode: ThreadSync) -> Self {
        self.thread_sync = mode;
        self
    }

    /// What exposures describe (default [`MetadataScope::Agent`]).
    pub fn metadata_scope(mut self, scope: MetadataScope) -> Self {
        self.scope = scope;
        self
    }

    /// Which NIXL plugin moves blocks to and from files
    /// ([`Connector::begin_file_write`](descriptor_core::Connector::begin_file_write)):
    /// [`Storage::PosixAio`] by default, created on the agent that posts
    /// this connector's transfers. A plugin that cannot be created leaves
    /// storage transfers [`Error::Unsupported`] (with the reason), and the
    /// rest of the backend working.
    pub fn storage(mut self, storage: Storage) -> Self {
        self.storage = storage;
        self
    }

    /// Whether a storage READ into host memory whose bytes are all in the
    /// page cache is served at once from the cached pages (`preadv2` with
    /// `RWF_NOWAIT`, which never waits for the disk) instead of through the
    /// POSIX plugin; a READ any of whose bytes are not cached, of an
    /// `O_DIRECT` file, or into device memory goes to NIXL whole. On by
    /// default: a cached 64 KiB READ takes 1.3 µs this way and 3-4 µs
    /// through the plugin (decision 0015).
    pub fn cached_reads(mut self, on: bool) -> Self {
        self.cached_reads = on;
        self
    }

    /// Whether a storage WRITE of host memory into files that go through
    /// the page cache is made at post with `pwrite` instead of through the
    /// POSIX plugin, when that runs over AIO ([`Storage::PosixAio`], the
    /// default): AIO writes such a file inside NIXL's post anyway, so the
    /// post takes as long either way, less NIXL's own cost. A WRITE of an
    /// `O_DIRECT` file or of device memory, over io_uring, or one a call
    /// fails (ENOSPC, EIO) goes to NIXL whole, which reports the failure.
    /// On by default: measured in decision 0015.
    ///
    /// [`Storage::PosixAio`]: crate::Storage::PosixAio
    pub fn buffered_writes(mut self, on: bool) -> Self {
        self.buffered_writes = on;
        self
    }

    /// Loads the runtime (see [`runtime::load`]), creates the agent and its backends.
    pub fn build(self) -> Result<NixlBackend> {
        let plugins = self
            .plugins
            .clone()
            .unwrap_or_else(|| vec!["UCX".to_owned()]);
        if let Some((plugin, key, _)) = self.params.iter().find(|(p, _, _)| !plugins.contains(p)) {
            return Err(Error::Unsupported {
                backend: NAME,
                what: format!(
                    "parameter {key:?} for the {plugin} plugin, which this agent does not load (plugins: {})",
                    plugins.join(", ")
                ),
            });
        }
        // The level first: set before the runtime's first load, it reaches
        // UCX through its environment, from its start (see `LogLevel`).
        if let Some(level) = self.log_level {
            runtime::set_log_level(level)?;
        }
        runtime::load()?;
        let serving = self.agent(&self.name, self.progress_thread, &plugins)?;
        // With NIXL's thread serving peers, this connector's own transfers go
        // through a second agent without one (see `crate::agents`).
        let initiator = if self.progress_thread {
            Some(self.agent(&initiator_name(&self.name), false, &plugins)?)
        } else {
            None
        };
        // A level set after the runtime was loaded but before UCX was (by
        // the first agent) reaches UCX now.
        runtime::apply_ucx_log_level();
        let agents = Agents::new(serving, initiator, self.notifications);
        // Before any memory is registered: NIXL registers each region with
        // every plugin the agent runs, and a storage transfer needs its
        // memory registered with the storage plugin.
        let storage = StorageState::create(agents.initiating(), self.storage);
        tracing::debug!(agent = %self.name, two_agents = agents.two(), notifications = ?agents.notifications, ?plugins, scope = ?self.scope, "created NIXL agents");
        let mut backend =
            NixlBackend::from_agents(self.name, agents, self.scope, self.tuning, storage);
        backend.cached_reads = self.cached_reads;
        backend.buffered_writes = self.buffered_writes;
        Ok(backend)
    }

    /// One NIXL agent called `name`, with the builder's plugins and settings.
    fn agent(&self, name: &str, progress_thread: bool, plugins: &[String]) -> Result<Agent> {
        let delay = self.tuning.progress_thread_delay;
        let config = AgentConfig {
            enable_prog_thread: progress_thread,
            pthr_delay_us: u64::try_from(delay.as_micros()).unwrap_or(u64::MAX),
            thread_sync: self.thread_sync,
            ..AgentConfig::default()
        };
        let context = |what: &str| format!("{what} (agent {name:?})");
        let agent = Agent::new_configured(name, &config)
            .map_err(|e| nixl_error(context("create agent"), e))?;
        for plugin in plugins {
            let (_mems, mut params) = agent
                .get_plugin_params(plugin)
                .map_err(|e| nixl_error(context(&format!("load plugin {plugin}")), e))?;
            for (_, key, value) in self.params.iter().filter(|(p, _, _)| p == plugin) {
                params.set(key, value).map_err(|e| {
                    nixl_error(context(&format!("set {plugin} parameter {key}")), e)
                })?;
            }
            agent
                .create_backend(plugin, &params)
                .map_err(|e| nixl_error(context(&format!("create {plugin} backend")), e))?;
        }
        Ok(agent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parameter_for_a_plugin_not_loaded_is_refused() {
        // Refused before the runtime is loaded: no NIXL needed.
        let refused = |builder: NixlBackendBuilder| match builder.build() {
            Err(Error::Unsupported { what, .. }) => what,
            Err(other) => panic!("unexpected error: {other}"),
            Ok(_) => panic!("built an agent with a stray parameter"),
        };
        let what = refused(NixlBackend::builder("stray").plugin_param("LIBFABRIC", "k", "v"));
        assert!(
            what.contains("LIBFABRIC plugin") && what.ends_with("(plugins: UCX)"),
            "{what}"
        );
        // UCX's setting, with UCX replaced by another plugin.
        let what = refused(
            NixlBackend::builder("stray")
                .plugin("POSIX")
                .peer_failure_detection(false),
        );
        assert!(
            what.contains("\"ucx_error_handling_mode\" for the UCX plugin")
                && what.ends_with("(plugins: POSIX)"),
            "{what}"
        );
    }

    #[test]
    fn the_progress_thread_delay_is_a_tuning_field() {
        let delay = Duration::from_millis(7);
        let builder = NixlBackend::builder("tuned").progress_thread_delay(delay);
        assert_eq!(builder.tuning.progress_thread_delay, delay);
        // `tuning` replaces every knob, the delay among them.
        let builder = builder.tuning(Tuning::default());
        assert_eq!(builder.tuning, Tuning::default());
    }

    #[test]
    fn peer_failure_detection_sets_ucx_error_handling_mode() {
        if !test_support::runtime_available() {
            return;
        }
        let mode_of = |builder: NixlBackendBuilder| {
            let backend = builder.build().unwrap();
            assert_eq!(backend.plugin_params("POSIX").unwrap(), None);
            let params = backend.plugin_params("UCX").unwrap().unwrap();
            params
                .into_iter()
                .find(|(key, _)| key == "ucx_error_handling_mode")
                .map(|(_, value)| value)
        };
        let name = |tag: &str| format!("errmode-{tag}-{}", std::process::id());
        let builder = |tag: &str| NixlBackend::builder(&name(tag));
        assert_eq!(mode_of(builder("default")).as_deref(), Some("peer"));
        let off = builder("off").peer_failure_detection(false);
        assert_eq!(mode_of(off).as_deref(), Some("none"));
        let on = builder("on").peer_failure_detection(true);
        assert_eq!(mode_of(on).as_deref(), Some("peer"));
        // The later setting wins.
        let raw = builder("raw").peer_failure_detection(false).plugin_param(
            "UCX",
            "ucx_error_handling_mode",
            "peer",
        );
        assert_eq!(mode_of(raw).as_deref(), Some("peer"));
    }
}
