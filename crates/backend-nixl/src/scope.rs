//! What an exposure's agent-metadata blob describes ([`MetadataScope`]), and
//! making it ([`ExposureMetadata`]). Why the default and its format:
//! docs/decisions/0012-exposure-metadata-in-nixl-format.md.

use std::sync::Mutex;

use descriptor_core::{Error, Result, Segment};
use nixl_sys::{Agent, MemType, RegDescList};

use crate::agent_metadata;
use crate::error::{NAME, nixl_error};
use crate::memory::mem_of;
use crate::sync::lock;

/// What the agent-metadata blob of an exposure describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MetadataScope {
    /// NIXL's own agent-metadata format (what `get_local_md` writes and
    /// Dynamo's Python workers load with `add_remote_agent`), holding the
    /// agent's connection info and only the regions that hold the exposed
    /// ranges: the blob of an exposure is the same size however many regions
    /// the agent registered (or leaked) before. The default, because a Python
    /// peer can load only this format.
    #[default]
    Agent,
    /// The same content as [`Agent`](MetadataScope::Agent) (connection info and
    /// the exposed regions, from `get_local_partial_md`), in this crate's
    /// two-part blob, as NIXL writes the two parts. Rust peers only; kept for
    /// peers that expect it.
    Exposed,
}

/// Makes the blob each exposure publishes, in one [`MetadataScope`], from
/// the serving agent (the one peers reach).
#[derive(Debug)]
pub(crate) struct ExposureMetadata {
    scope: MetadataScope,
    /// The serving agent's connection-only metadata, made once.
    connection: Mutex<Option<Vec<u8>>>,
}

impl ExposureMetadata {
    pub(crate) fn new(scope: MetadataScope) -> ExposureMetadata {
        ExposureMetadata {
            scope,
            connection: Mutex::new(None),
        }
    }

    /// The scope the blobs are made in.
    pub(crate) fn scope(&self) -> MetadataScope {
        self.scope
    }

    /// The blob an exposure of `segments` publishes, made with `serving`.
    pub(crate) fn exposure_md(&self, serving: &Agent, segments: &[Segment]) -> Result<Vec<u8>> {
        match self.scope {
            MetadataScope::Agent | MetadataScope::Exposed if segments.is_empty() => {
                self.connection_md(serving)
            }
            MetadataScope::Agent => self.agent_format_md(serving, segments),
            MetadataScope::Exposed => self.scoped_md(serving, segments),
        }
    }

    /// The serving agent's connection-only metadata, made once.
    fn connection_md(&self, serving: &Agent) -> Result<Vec<u8>> {
        let mut cached = lock(&self.connection);
        if let Some(md) = &*cached {
            return Ok(md.clone());
        }
        let empty =
            RegDescList::new(MemType::Dram).map_err(|e| nixl_error("create a region list", e))?;
        let md = serving
            .get_local_partial_md(&empty, None)
            .map_err(|e| nixl_error("get connection metadata", e))?;
        *cached = Some(md.clone());
        Ok(md)
    }

    /// Connection info plus the regions of `segments` (not empty), in
    /// NIXL's one-blob format: what `get_local_md` would write for an agent
    /// that registered only these regions.
    fn agent_format_md(&self, serving: &Agent, segments: &[Segment]) -> Result<Vec<u8>> {
        let two_part = self.scoped_md(serving, segments)?;
        // NIXL wrote both parts a moment ago; a refusal here is NIXL's format
        // changing under this crate, reported rather than published.
        let md = agent_metadata::AgentMetadata::parse(&two_part).map_err(|e| {
            Error::backend(
                NAME,
                "make exposure metadata",
                format!("NIXL's own metadata did not parse: {e}"),
            )
        })?;
        Ok(md.to_blob(&md.name))
    }

    /// Connection info plus the regions of `segments` (not empty), in the
    /// two-part blob [`agent_metadata::scoped_blob`] writes.
    fn scoped_md(&self, serving: &Agent, segments: &[Segment]) -> Result<Vec<u8>> {
        let (mem, _) = mem_of(segments[0].device)?;
        let mut list = RegDescList::new(mem).map_err(|e| nixl_error("create a region list", e))?;
        for s in segments {
            list.add_desc(s.addr, s.len, mem_of(s.device)?.1);
        }
        let regions = serving
            .get_local_partial_md(&list, None)
            .map_err(|e| nixl_error("get partial metadata", e))?;
        let connection = self.connection_md(serving)?;
        Ok(agent_metadata::scoped_blob(&connection, &regions))
    }
}
