//! What a run reports: a structured record per stage (what kind, how its tasks ran, what
//! they moved) and the run's summary.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde::Serialize;

use crate::exec::memory::human_bytes;
use crate::exec::Progress;

/// What a stage computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StageKind {
    /// A fused elementwise program (with its slices, joins, FFTs) written block by block.
    Compute,
    /// A plain copy of one array into other chunks, through one encoder stream per chunk.
    Stream,
    /// A reduction over some axes.
    Reduce,
    /// Python functions called once per output chunk.
    ChunkFunction,
}

impl StageKind {
    /// The name, as the JSON summary spells it.
    pub fn name(self) -> &'static str {
        match self {
            StageKind::Compute => "compute",
            StageKind::Stream => "stream",
            StageKind::Reduce => "reduce",
            StageKind::ChunkFunction => "chunk_function",
        }
    }
}

/// How a stage's tasks get their input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// One task per block of output chunks, each reading the chunks it needs.
    Blocks,
    /// Blocks that read bands of their input, each band loaded once and let go before the
    /// next (an FFT along a chunked axis).
    Bands,
    /// One encoder stream per output chunk, fed as the input's chunks are read.
    Streams,
    /// Pieces of the input folded into partial results per output chunk.
    Folds,
    /// One Python call per output chunk.
    Calls,
}

impl Strategy {
    /// The name, as the JSON summary spells it.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Blocks => "blocks",
            Strategy::Bands => "bands",
            Strategy::Streams => "streams",
            Strategy::Folds => "folds",
            Strategy::Calls => "calls",
        }
    }
}

/// Decoded chunks of an array kept for later stages that read it again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeptChunks {
    /// The array.
    pub array: String,
    /// The room the cache was given.
    pub room: u64,
    /// Bytes it held when the stage ended (0 when explaining, as nothing ran).
    pub kept: u64,
}

/// One stage as it ran (or, explained, as it would run).
#[derive(Debug, Clone, Serialize)]
pub struct StageRecord {
    /// Position in the plan's stages.
    pub index: usize,
    /// What it computes.
    pub kind: StageKind,
    /// The planner's label (`write y`, `mean of x`, ...).
    pub label: String,
    /// The array it writes.
    pub output: String,
    /// How its tasks get their input.
    pub strategy: Strategy,
    /// What the stage's tasks read: an array, or the transform or join of arrays that they
    /// compute where they read it.
    pub reads: Vec<String>,
    /// The elementwise functions fused into the stage, in evaluation order.
    pub fused: Vec<String>,
    /// Output chunks per task along each axis (empty for reductions).
    pub unit: Vec<u64>,
    /// Tasks planned for the stage, those skipped as done included.
    pub tasks: u64,
    /// Parts the stage's tasks fall into: what may run apart, in other calls or processes
    /// (each task, or for a reduction the tasks of one output chunk).
    pub parts: u64,
    /// Whether the stage writes a target that an unfinished run of the same job had begun.
    pub resumed: bool,
    /// Tasks a resumed run skipped because their output chunks were written already.
    pub tasks_done_before: u64,
    /// Bands of input the tasks read (0 unless `strategy` is bands).
    pub bands: u64,
    /// Arrays whose decoded chunks this stage keeps for later stages.
    pub caches: Vec<KeptChunks>,
    /// Small arrays loaded once and shared by every task of the stage.
    pub shared: Vec<String>,
    /// The most one task reserves of the budget (bands included), as planned.
    pub largest_task_bytes: u64,
    /// What the stage's tasks may reserve in all.
    pub task_budget: u64,
    /// Bytes read from stores.
    pub bytes_read: u64,
    /// Bytes of chunks decoded.
    pub decoded_bytes: u64,
    /// Bytes written to stores.
    pub bytes_written: u64,
    /// Wall time.
    pub seconds: f64,
    /// Where the stage's work ran: `cpu`, or `gpu` (its fused program on the run's GPU).
    pub device: String,
    /// On a run with a GPU, why the stage (or a part of it) ran on the CPU.
    pub device_note: Option<String>,
    /// Remarks that fit no field.
    pub notes: Vec<String>,
}

impl StageRecord {
    /// A record of stage `index`, to be filled in as the stage runs.
    pub fn new(index: usize, kind: StageKind, label: &str, output: &str) -> Self {
        StageRecord {
            index,
            kind,
            label: label.to_string(),
            output: output.to_string(),
            strategy: match kind {
                StageKind::Compute => Strategy::Blocks,
                StageKind::Stream => Strategy::Streams,
                StageKind::Reduce => Strategy::Folds,
                StageKind::ChunkFunction => Strategy::Calls,
            },
            reads: Vec::new(),
            fused: Vec::new(),
            unit: Vec::new(),
            tasks: 0,
            parts: 0,
            resumed: false,
            tasks_done_before: 0,
            bands: 0,
            caches: Vec::new(),
            shared: Vec::new(),
            largest_task_bytes: 0,
            task_budget: 0,
            bytes_read: 0,
            decoded_bytes: 0,
            bytes_written: 0,
            seconds: 0.0,
            device: "cpu".to_string(),
            device_note: None,
            notes: Vec::new(),
        }
    }

    /// One line for people: the label, how the stage ran, and what it kept.
    pub fn describe(&self) -> String {
        let mut text = self.label.clone();
        let unit = |what: &str| format!(" ({what} of {:?} chunks)", self.unit);
        match self.strategy {
            Strategy::Blocks => text.push_str(&unit("blocks")),
            Strategy::Bands => {
                text.push_str(&unit("blocks"));
                let s = if self.bands == 1 { "" } else { "s" };
                text.push_str(&format!(" (in {} band{s})", self.bands));
            }
            Strategy::Streams => text.push_str(&unit("groups")),
            Strategy::Folds | Strategy::Calls => {}
        }
        if self.resumed {
            text.push_str(&format!(
                " (resumed: {} of {} tasks were done)",
                self.tasks_done_before, self.tasks
            ));
        }
        if !self.shared.is_empty() {
            text.push_str(&format!(" (loaded {} once)", self.shared.join(", ")));
        }
        for c in &self.caches {
            text.push_str(&match c.kept {
                0 => format!(
                    " (keeps up to {} of {}'s decoded chunks for a later stage)",
                    human_bytes(c.room),
                    c.array
                ),
                kept => format!(
                    " (kept {} of {}'s decoded chunks for a later stage)",
                    human_bytes(kept),
                    c.array
                ),
            });
        }
        for note in &self.notes {
            text.push_str(&format!(" ({note})"));
        }
        text
    }
}

/// The run's counters at one moment, to attribute what a stage moved.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot {
    at: Instant,
    read: u64,
    decoded: u64,
    written: u64,
}

impl Snapshot {
    /// The counters of `progress` now.
    pub fn of(progress: &Progress) -> Self {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Snapshot {
            at: Instant::now(),
            read: load(&progress.bytes_read),
            decoded: load(&progress.decoded_bytes),
            written: load(&progress.bytes_written),
        }
    }

    /// Fills `record`'s byte counts and time with what `progress` moved since this snapshot.
    pub fn close(&self, progress: &Progress, record: &mut StageRecord) {
        let now = Snapshot::of(progress);
        record.bytes_read = now.read - self.read;
        record.decoded_bytes = now.decoded - self.decoded;
        record.bytes_written = now.written - self.written;
        record.seconds = self.at.elapsed().as_secs_f64();
    }
}

/// What a run did.
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    /// Plan name.
    pub plan: String,
    /// Wall time.
    pub seconds: f64,
    /// Tasks run.
    pub tasks: u64,
    /// Stages run, in order.
    pub stages: Vec<StageRecord>,
    /// Bytes read from stores.
    pub bytes_read: u64,
    /// Bytes written to stores.
    pub bytes_written: u64,
    /// Bytes of chunks decoded.
    pub decoded_bytes: u64,
    /// Peak resident memory of the process (bytes), where the OS reports it.
    pub peak_rss: u64,
    /// The memory budget.
    pub max_mem: u64,
    /// Compute threads.
    pub threads: usize,
    /// Arrays written.
    pub outputs: Vec<String>,
    /// Where fused elementwise programs ran: `cpu`, or `cuda: NAME (compute_XY)`.
    pub device: String,
    /// Blocks of output whose fused program ran on the GPU.
    pub gpu_blocks: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_those_of_the_json_summary() {
        use StageKind::*;
        for k in [Compute, Stream, Reduce, ChunkFunction] {
            let json = serde_json::to_string(&k).unwrap();
            assert_eq!(json, format!("\"{}\"", k.name()));
        }
        for s in [
            Strategy::Blocks,
            Strategy::Bands,
            Strategy::Streams,
            Strategy::Folds,
            Strategy::Calls,
        ] {
            let json = serde_json::to_string(&s).unwrap();
            assert_eq!(json, format!("\"{}\"", s.name()));
        }
    }

    #[test]
    fn the_description_says_how_the_stage_ran() {
        let mut r = StageRecord::new(1, StageKind::Compute, "write y", "y");
        r.unit = vec![1, 2];
        r.strategy = Strategy::Bands;
        r.bands = 3;
        r.resumed = true;
        (r.tasks_done_before, r.tasks) = (2, 5);
        assert_eq!(
            r.describe(),
            "write y (blocks of [1, 2] chunks) (in 3 bands) (resumed: 2 of 5 tasks were done)"
        );
    }
}
