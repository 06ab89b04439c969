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
    /// Batches of a job run in batches that run at once (0: it runs in one process): a
    /// stage of blocks is cut into at least that many tasks where its output allows.
    pub spread: usize,
}
