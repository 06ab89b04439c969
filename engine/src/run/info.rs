//! What is stored at a URL: the array's metadata and its stored size, or a group's arrays.

use serde::Serialize;

use crate::error::Result;
use crate::store::open_store;
use crate::zarr::group::{members, read_group};
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

/// Describes the group at `url`: its arrays, each as [`info`] describes it.
#[derive(Debug, Clone, Serialize)]
pub struct GroupInfo {
    /// 2 or 3.
    pub zarr_format: u8,
    /// Its arrays, by name.
    pub arrays: Vec<GroupMember>,
    /// The groups nested in it, by name (not described).
    pub groups: Vec<String>,
}

/// One array of a group.
#[derive(Debug, Clone, Serialize)]
pub struct GroupMember {
    /// Its name in the group.
    pub name: String,
    /// What [`info`] says of it; `None` when the engine cannot describe it.
    pub info: Option<StoreInfo>,
    /// Why not, then (an array of strings, say).
    pub note: Option<String>,
}

/// The arrays of the group at `url`; `None` when `url` holds no group.
pub fn group_info(url: &str) -> Result<Option<GroupInfo>> {
    let store = open_store(url, 4)?;
    let Some(group) = read_group(store.as_ref())? else {
        return Ok(None);
    };
    let members = members(store.as_ref())?;
    let arrays = members
        .arrays
        .into_iter()
        .map(|name| {
            let member = format!("{}/{name}", url.trim_end_matches('/'));
            let (info, note) = match info(&member) {
                Ok(i) => (Some(i), None),
                Err(e) => (None, Some(e.message)),
            };
            GroupMember { name, info, note }
        })
        .collect();
    Ok(Some(GroupInfo {
        zarr_format: group.zarr_format,
        arrays,
        groups: members.groups,
    }))
}
