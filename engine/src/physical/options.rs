//! Planning inputs besides the graph.

/// Planning inputs besides the graph.
#[derive(Debug, Clone, Copy)]
pub struct PlanOptions {
    /// The memory budget in bytes.
    pub budget: u64,
    /// Compute threads.
    pub threads: usize,
    /// Bytes of reads per batch of a compute task.
    pub batch_bytes: u64,
}
