//! Execution: the driver that runs a physical plan stage by stage, the scheduler, the memory
//! budget, tasks, progress and cancellation.

pub mod band_groups;
pub mod chunk_cache;
pub mod cpu_cache;
pub mod driver;
pub mod held;
pub mod memory;
pub mod ops;
pub mod progress;
pub mod resident;
pub mod scheduler;
pub mod task;

pub use memory::{Budget, Reservation};
pub use progress::Progress;
pub use scheduler::Scheduler;
pub use task::{Part, Processor, ReadOp, Task, TaskContext, WriteOp};
