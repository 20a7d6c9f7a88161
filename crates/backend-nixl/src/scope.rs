//! What an exposure's agent-metadata blob describes ([`MetadataScope`]), and
//! making it. Why the default: docs/decisions/0006-full-agent-metadata-default.md.

use descriptor_core::{Result, Segment};
use nixl_sys::{MemType, RegDescList};

use crate::agent_metadata;
use crate::agents::{lock, mem_of, nixl_error};
use crate::backend::NixlBackend;

/// What the agent-metadata blob of an exposure describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MetadataScope {
    /// The agent's full metadata (`get_local_md`): every registered region plus
    /// connection info, exactly what Dynamo's Python workers publish and load.
    /// The default, because a Python peer can load only this.
    #[default]
    Agent,
    /// Only the exposed regions (`get_local_partial_md`) plus connection info, in
    /// a two-part blob this crate reads: a peer learns nothing of the agent's
    /// other registrations and the blob stays small however many regions the
    /// agent holds. Rust peers only (NIXL 1.5's C API cannot put connection info
    /// and chosen regions into one blob).
    Exposed,
}

impl NixlBackend {
    /// This agent's full metadata as NIXL serializes it (`getLocalMD`: its
    /// connection info and every region registered with it), whatever the
    /// [`MetadataScope`]: what a peer loads to reach it, and what Dynamo's
    /// `Connection.metadata` returns (`nixl_agent.get_agent_metadata()`).
    /// With NIXL's progress thread on, the serving agent's (the one peers
    /// reach).
    pub fn agent_metadata(&self) -> Result<Vec<u8>> {
        self.live
            .agents
            .serving
            .get_local_md()
            .map_err(|e| nixl_error("get agent metadata", e))
    }

    /// The blob an exposure of `segments` publishes, in this backend's scope.
    pub(crate) fn exposure_md(&self, segments: &[Segment]) -> Result<Vec<u8>> {
        match self.scope {
            MetadataScope::Agent => self.agent_metadata(),
            MetadataScope::Exposed if segments.is_empty() => self.connection_md(),
            MetadataScope::Exposed => self.scoped_md(segments),
        }
    }

    /// This agent's connection-only metadata, made once.
    fn connection_md(&self) -> Result<Vec<u8>> {
        let mut cached = lock(&self.connection_md);
        if let Some(md) = &*cached {
            return Ok(md.clone());
        }
        let empty =
            RegDescList::new(MemType::Dram).map_err(|e| nixl_error("create a region list", e))?;
        let md = self
            .live
            .agents
            .serving
            .get_local_partial_md(&empty, None)
            .map_err(|e| nixl_error("get connection metadata", e))?;
        *cached = Some(md.clone());
        Ok(md)
    }

    /// Connection info plus the regions of `segments` (not empty), in the
    /// two-part blob [`agent_metadata::scoped_blob`] writes.
    fn scoped_md(&self, segments: &[Segment]) -> Result<Vec<u8>> {
        let (mem, _) = mem_of(segments[0].device)?;
        let mut list = RegDescList::new(mem).map_err(|e| nixl_error("create a region list", e))?;
        for s in segments {
            list.add_desc(s.addr, s.len, mem_of(s.device)?.1);
        }
        let regions = self
            .live
            .agents
            .serving
            .get_local_partial_md(&list, None)
            .map_err(|e| nixl_error("get partial metadata", e))?;
        let connection = self.connection_md()?;
        Ok(agent_metadata::scoped_blob(&connection, &regions))
    }
}
