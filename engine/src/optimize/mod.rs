//! From a validated graph to stages of tasks: fusion, rechunk planning and memory
//! projection. Each rule lives in its own file; `stages::plan` walks the graph and applies them.

pub mod bands;
pub mod copy;
pub mod epilogue;
pub mod fft;
pub mod fuse;
pub mod joins;
pub mod lift;
pub mod materials;
pub mod rechunk;
pub mod stages;
