//! From a validated graph to stages of tasks: fusion, rechunk planning and memory
//! projection. Each rule lives in its own file; `stages::plan` applies them in order.

pub mod bands;
pub mod fft;
pub mod fuse;
pub mod joins;
pub mod lift;
pub mod rechunk;
pub mod stages;
