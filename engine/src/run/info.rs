//! What is stored at a URL: the array's metadata and its stored size.

use serde::Serialize;

use crate::error::Result;
use crate::store::open_store;
use crate::zarr::{ArrayInfo, ZarrArray};

/// Describes the array at `url`, with its stored size.
#[derive(Debug, Clone, Serialize)]
pub struct StoreInfo {
    /// Metadata summary.
    #[serde(flatten)]
    pub info: ArrayInfo,
    /// Bytes of stored chunks.
    pub stored_bytes: u64,
    /// Chunks present in the store.
    pub stored_chunks: u64,
    /// Decoded size over stored size.
    pub compression_ratio: f64,
}

/// Reads the metadata and chunk sizes of the array at `url`.
pub fn info(url: &str) -> Result<StoreInfo> {
    let store = open_store(url, 4)?;
    let arr = ZarrArray::open(store.clone())?;
    let mut stored = 0u64;
    let mut count = 0u64;
    for idx in arr.grid().chunk_indices() {
        if let Some(s) = store.size_of(&arr.chunk_key(&idx))? {
            stored += s;
            count += 1;
        }
    }
    let info = arr.info().clone();
    let ratio = if stored > 0 {
        info.nbytes as f64 / stored as f64
    } else {
        0.0
    };
    Ok(StoreInfo {
        info,
        stored_bytes: stored,
        stored_chunks: count,
        compression_ratio: ratio,
    })
}
