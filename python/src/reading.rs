//! Direct reads into caller memory: `ArrayReader` opens an array once (its metadata read
//! once) and fills numpy buffers the caller allocates with windows of it, with the GIL
//! released. One window is a region read; many are the random crops of a training loop.

use std::sync::Arc;

use chunkfuse_engine::array::DType;
use chunkfuse_engine::read;
use chunkfuse_engine::zarr::ZarrArray;
use chunkfuse_engine::Error;
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::device_array::DeviceArray;
use crate::to_py;

/// An array opened for direct reads.
#[pyclass(frozen, module = "chunkfuse._engine")]
pub struct ArrayReader {
    array: Arc<ZarrArray>,
}

#[pymethods]
impl ArrayReader {
    /// Opens the array at `url` (a path, `file://`, `s3://`, `gs://`, `http(s)://` or
    /// `memory://` URL).
    #[new]
    fn new(py: Python<'_>, url: &str) -> PyResult<Self> {
        let array = crate::gate::call(py, || read::open_array(url, 8))?;
        Ok(ArrayReader {
            array: Arc::new(array),
        })
    }

    /// numpy's name for the element type.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.array.dtype().name()
    }

    /// The array's shape.
    #[getter]
    fn shape(&self) -> Vec<u64> {
        self.array.shape()
    }

    /// The URL the array was opened with.
    #[getter]
    fn url(&self) -> String {
        self.array.url().to_string()
    }

    /// Pickles by URL: the copy (in a spawned worker, say) opens the array again.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (String,))> {
        let url = slf.get().array.url().to_string();
        Ok((slf.get_type().into_any(), (url,)))
    }

    fn __repr__(&self) -> String {
        format!(
            "ArrayReader({:?}, shape={:?}, dtype={})",
            self.array.url(),
            self.array.shape(),
            self.array.dtype().name()
        )
    }

    /// Fills `out` (a writable C-contiguous uint8 buffer of exactly `len(starts) *
    /// prod(shape) * itemsize` bytes) with the windows of `shape` at each of `starts`,
    /// stacked in order; `threads` decode threads (0: one per core). With `cache`, chunks it
    /// holds are copied from it and the chunks decoded are kept there.
    #[pyo3(signature = (starts, shape, out, threads=0, cache=None))]
    fn read_into(
        &self,
        py: Python<'_>,
        starts: Vec<Vec<u64>>,
        shape: Vec<u64>,
        out: &Bound<'_, PyAny>,
        threads: usize,
        cache: Option<Py<ChunkCache>>,
    ) -> PyResult<()> {
        let buffer = PyBuffer::<u8>::get(out)?;
        if buffer.readonly() || !buffer.is_c_contiguous() {
            return Err(to_py(Error::plan(
                "out",
                "needs a writable, C-contiguous uint8 buffer",
            )));
        }
        let ptr = buffer.buf_ptr() as usize;
        let len = buffer.len_bytes();
        let array = self.array.clone();
        let cache = cache.map(|c| c.get().cache.clone());
        crate::gate::call(py, move || {
            // SAFETY: the buffer protocol keeps `out`'s memory alive and in place while
            // `buffer` is held (until this function returns, and the gate returns only once
            // this closure has), it is writable and `len` bytes long; no Python code writes
            // it meanwhile (this call holds it).
            let dst = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) };
            read::read_windows_cached(&array, &starts, &shape, dst, threads, cache.as_deref())
        })?;
        drop(buffer);
        Ok(())
    }

    /// Reads the windows of `shape` at each of `starts` onto the GPU (`CHUNKFUSE_CUDA_DEVICE`
    /// picks it) as one array of `out_shape`, which holds `len(starts) * prod(shape)` values:
    /// zstd chunks are decoded there by nvCOMP, others on `threads` CPU threads (0: one per
    /// core). Without a usable GPU, an error saying why, before anything is read.
    #[pyo3(signature = (starts, shape, out_shape, threads=0))]
    fn read_device(
        &self,
        py: Python<'_>,
        starts: Vec<Vec<u64>>,
        shape: Vec<u64>,
        out_shape: Vec<u64>,
        threads: usize,
    ) -> PyResult<DeviceArray> {
        let array = self.array.clone();
        let (mut out, stats) = crate::gate::call(py, move || {
            let gpu = chunkfuse_engine::kernels::eval::gpu::gpu()?;
            read::read_windows_to_device(&array, &starts, &shape, gpu, threads)
        })?;
        out.reshape(&out_shape).map_err(to_py)?;
        Ok(DeviceArray::new(out, stats))
    }

    /// Fills `out` (a writable C-contiguous buffer of exactly `prod(len(s) for s in starts)`
    /// uint64 values, as bytes) with the number of missing values (NaN, or `missing` as
    /// stored) in the window of `shape` at every combination of `starts` (one ascending list
    /// of window starts per axis), in C order over those lists; each chunk the windows touch
    /// is decoded once. `threads` decode threads (0: one per core).
    #[pyo3(signature = (shape, starts, out, missing=None, threads=0))]
    fn count_missing(
        &self,
        py: Python<'_>,
        shape: Vec<u64>,
        starts: Vec<Vec<u64>>,
        out: &Bound<'_, PyAny>,
        missing: Option<f64>,
        threads: usize,
    ) -> PyResult<()> {
        let buffer = PyBuffer::<u8>::get(out)?;
        let total: usize = starts.iter().map(Vec::len).product();
        if buffer.readonly() || !buffer.is_c_contiguous() || buffer.len_bytes() != total * 8 {
            return Err(to_py(Error::plan(
                "out",
                format!("needs a writable, C-contiguous buffer of {total} uint64 values"),
            )));
        }
        let array = self.array.clone();
        let counts = crate::gate::call(py, move || {
            read::missing_counts(&array, &shape, &starts, missing, threads)
        })?;
        let bytes: Vec<u8> = counts.iter().flat_map(|c| c.to_ne_bytes()).collect();
        buffer.copy_from_slice(py, &bytes)?;
        drop(buffer);
        Ok(())
    }
}

/// Decoded chunks kept across reads within a byte budget (least recently used dropped
/// first), shared by the readers given it. It assumes the arrays do not change meanwhile.
#[pyclass(frozen, module = "chunkfuse._engine")]
pub struct ChunkCache {
    cache: Arc<read::ChunkCache>,
}

#[pymethods]
impl ChunkCache {
    /// A cache of at most `max_bytes` bytes of decoded chunks (0: caches nothing).
    #[new]
    fn new(max_bytes: i128) -> PyResult<Self> {
        let budget = usize::try_from(max_bytes).map_err(|_| {
            PyValueError::new_err(format!(
                "ChunkCache: max_bytes must be a byte count from 0 to {}, got {max_bytes}",
                usize::MAX
            ))
        })?;
        Ok(ChunkCache {
            cache: Arc::new(read::ChunkCache::new(budget)),
        })
    }

    /// The byte budget.
    #[getter]
    fn max_bytes(&self) -> usize {
        self.cache.budget()
    }

    /// Decoded bytes held now.
    #[getter]
    fn bytes(&self) -> usize {
        self.cache.stats().bytes
    }

    /// Chunks held now.
    #[getter]
    fn entries(&self) -> usize {
        self.cache.stats().entries
    }

    /// Lookups that found their chunk, since made or cleared.
    #[getter]
    fn hits(&self) -> u64 {
        self.cache.stats().hits
    }

    /// Lookups that did not (the chunk was decoded), since made or cleared.
    #[getter]
    fn misses(&self) -> u64 {
        self.cache.stats().misses
    }

    /// Drops every held chunk and zeroes the counts.
    fn clear(&self) {
        self.cache.clear()
    }

    /// Pickles as an empty cache of the same budget (a spawned worker fills its own).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (usize,))> {
        Ok((slf.get_type().into_any(), (slf.get().cache.budget(),)))
    }

    fn __repr__(&self) -> String {
        let s = self.cache.stats();
        format!(
            "ChunkCache(max_bytes={}, bytes={}, entries={}, hits={}, misses={})",
            self.cache.budget(),
            s.bytes,
            s.entries,
            s.hits,
            s.misses
        )
    }
}

/// Decodes packed values as xarray does: `raw` (values of numpy dtype `stored`) into `out`
/// (as many values of `decoded`, float32 or float64; a writable C-contiguous buffer), each
/// converted, times `scale`, plus `offset`, NaN where it equals `fill`; with the GIL
/// released, on `threads` threads (0: one per core).
#[pyfunction]
#[pyo3(signature = (raw, stored, out, decoded, scale=None, offset=None, fill=None, threads=0))]
#[allow(clippy::too_many_arguments)]
pub fn decode_cf(
    py: Python<'_>,
    raw: &Bound<'_, PyAny>,
    stored: &str,
    out: &Bound<'_, PyAny>,
    decoded: &str,
    scale: Option<f64>,
    offset: Option<f64>,
    fill: Option<f64>,
    threads: usize,
) -> PyResult<()> {
    let stored = DType::parse(stored).map_err(to_py)?;
    let decoded = DType::parse(decoded).map_err(to_py)?;
    let src = PyBuffer::<u8>::get(raw)?;
    let dst = PyBuffer::<u8>::get(out)?;
    if !src.is_c_contiguous() || dst.readonly() || !dst.is_c_contiguous() {
        return Err(to_py(Error::plan(
            "CF decoding",
            "needs C-contiguous buffers, the output writable",
        )));
    }
    let (sp, sl) = (src.buf_ptr() as usize, src.len_bytes());
    let (dp, dl) = (dst.buf_ptr() as usize, dst.len_bytes());
    let cf = read::CfDecoding {
        scale,
        offset,
        fill,
    };
    crate::gate::call(py, move || {
        // SAFETY: both buffers stay alive and in place while `src` and `dst` are held (until
        // this function returns, after the gate); `out` is writable and no Python code
        // touches either meanwhile. If they overlap the values are garbage, not unsafe.
        let raw = unsafe { std::slice::from_raw_parts(sp as *const u8, sl) };
        let out = unsafe { std::slice::from_raw_parts_mut(dp as *mut u8, dl) };
        read::decode_cf(raw, stored, out, decoded, cf, threads)
    })?;
    drop((src, dst));
    Ok(())
}
