//! The training loader's keyed permutation (`chunkfuse_engine::permute`), for Python.

use chunkfuse_engine::permute::Feistel;
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;

/// Fills `out` (a writable int64 buffer as long as `positions`) with the element of the
/// permutation of `range(size)` given by the round `keys` at each of `positions` (int64), or
/// with `inverse`, the position of each element. Bounded work (a few rounds per value), so
/// it runs with the GIL released but needs no cancel gate.
#[pyfunction]
#[pyo3(signature = (size, keys, positions, out, inverse=false))]
pub fn feistel_permute(
    py: Python<'_>,
    size: u64,
    keys: Vec<u64>,
    positions: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    inverse: bool,
) -> PyResult<()> {
    if size == 0 {
        return Err(PyValueError::new_err(
            "a permutation needs at least one element, got size 0",
        ));
    }
    let input = PyBuffer::<i64>::get(positions)?.to_vec(py)?;
    let output = PyBuffer::<i64>::get(out)?;
    if output.readonly() || output.item_count() != input.len() {
        return Err(PyValueError::new_err(format!(
            "out must be a writable int64 buffer of {} values",
            input.len()
        )));
    }
    let perm = Feistel::new(size, keys);
    let result: Option<Vec<i64>> = py.detach(|| {
        input
            .iter()
            .map(|&p| {
                let p = u64::try_from(p).ok()?;
                perm.at(p, inverse).map(|e| e as i64)
            })
            .collect()
    });
    let result =
        result.ok_or_else(|| PyIndexError::new_err(format!("values must lie in range({size})")))?;
    output.copy_from_slice(py, &result)?;
    Ok(())
}
