//! The arrays of a run and what the executor holds for each while stages read it: every
//! value of an array that a stage's tasks share (see `exec::resident`), a band of one that an
//! FFT stage's tasks read, decoded chunks kept for a later stage (see `exec::chunk_cache`).
//! The Zarr adapter knows none of this: it is the executor's state, kept beside the arrays.

use std::ops::Deref;
use std::sync::{Arc, Mutex};

use super::chunk_cache::ChunkCache;
use crate::array::{Buffer, Region};
use crate::zarr::ZarrArray;

/// What the executor holds for one array.
#[derive(Default)]
pub struct Held {
    /// Every value of the array, decoded, while a stage shares it among its tasks.
    resident: Mutex<Option<Arc<Buffer>>>,
    /// The values of one region (a band), decoded, while a stage's FFT tasks read it.
    band: Mutex<Option<(Region, Arc<Buffer>)>>,
    /// Decoded chunks kept for a later stage, while one is.
    cache: Mutex<Option<Arc<ChunkCache>>>,
}

/// The value in `slot`, cloned (none when a holder panicked while setting it).
fn get<T: Clone>(slot: &Mutex<Option<T>>) -> Option<T> {
    slot.lock().ok().and_then(|v| v.clone())
}

/// Puts `value` in `slot`.
fn set<T>(slot: &Mutex<Option<T>>, value: Option<T>) {
    if let Ok(mut v) = slot.lock() {
        *v = value;
    }
}

impl Held {
    /// The array's values held in memory for the running stage (C order, whole array).
    pub fn resident(&self) -> Option<Arc<Buffer>> {
        get(&self.resident)
    }

    /// Holds the array's values in memory for its readers, or with `None` lets them go.
    pub fn set_resident(&self, values: Option<Arc<Buffer>>) {
        set(&self.resident, values)
    }

    /// The band of the array held in memory for the running stage (its region, and its
    /// values in C order over it).
    pub fn band(&self) -> Option<(Region, Arc<Buffer>)> {
        get(&self.band)
    }

    /// Holds a band of the array in memory for its readers, or with `None` lets it go.
    pub fn set_band(&self, band: Option<(Region, Arc<Buffer>)>) {
        set(&self.band, band)
    }

    /// The cache that keeps the array's decoded chunks for a later stage.
    pub fn chunk_cache(&self) -> Option<Arc<ChunkCache>> {
        get(&self.cache)
    }

    /// Keeps decoded chunks in `cache` from now on, or with `None` lets them go.
    pub fn set_chunk_cache(&self, cache: Option<Arc<ChunkCache>>) {
        set(&self.cache, cache)
    }
}

/// The arrays of a run, by material, each with what the executor holds for it. Reads as the
/// slice of arrays; [`Materials::held`] gives the held state.
pub struct Materials {
    arrays: Vec<Arc<ZarrArray>>,
    held: Vec<Arc<Held>>,
}

impl Materials {
    /// `arrays`, holding nothing yet.
    pub fn new(arrays: Vec<Arc<ZarrArray>>) -> Self {
        let held = arrays.iter().map(|_| Arc::default()).collect();
        Materials { arrays, held }
    }

    /// What the executor holds for material `mat`.
    pub fn held(&self, mat: usize) -> &Arc<Held> {
        &self.held[mat]
    }
}

impl Deref for Materials {
    type Target = [Arc<ZarrArray>];

    fn deref(&self) -> &Self::Target {
        &self.arrays
    }
}
