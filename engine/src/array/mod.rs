//! Array fundamentals: dtypes and promotion, chunk grids and regions, typed buffers.

pub mod buffer;
pub mod dtype;
pub mod grid;
pub mod pool;

pub use buffer::Buffer;
pub use dtype::DType;
pub use grid::{AxisChunks, ChunkGrid, Region};
