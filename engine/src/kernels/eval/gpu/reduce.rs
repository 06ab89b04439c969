//! A reduction on the device: accumulators for every output value kept in device memory
//! while slabs of the input (device arrays a read filled) are folded into them one after
//! another, then finished into the output dtype and copied to the host once.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use super::device_array::DeviceArray;
use super::failure::{cuda_error, guarded};
use super::reduce_source::{reduce_source, Fold};
use super::runtime::Gpu;
use crate::array::{Buffer, DType};
use crate::error::{Error, ErrorKind, Result};
use crate::kernels::eval::program::Program;
use crate::plan::ReduceFunc;

/// Threads per block of every reduction kernel.
const BLOCK: u32 = 256;
/// Blocks one launch runs at most (the kernels loop over the rest).
const MAX_BLOCKS: u64 = 1 << 16;

/// A reduction in progress on the device.
pub struct DeviceReduction {
    gpu: &'static Gpu,
    stream: Arc<CudaStream>,
    partial: CudaFunction,
    merge: CudaFunction,
    finish: CudaFunction,
    /// The function (an arg-reduction's lanes of NaN only are checked when it finishes).
    func: ReduceFunc,
    /// Accumulators, counts and auxiliaries (squared deviations, indices), one per output
    /// value.
    state: [DeviceArray; 3],
    /// Partial states of the last fold (grown as folds need).
    part: Option<[DeviceArray; 3]>,
    /// Output values.
    len: u64,
    /// The input's shape and the reduced axes.
    shape: Vec<u64>,
    axes: Vec<usize>,
}

/// The launch shape for `n` threads of work.
fn config(n: u64) -> LaunchConfig {
    let blocks = n.div_ceil(u64::from(BLOCK)).clamp(1, MAX_BLOCKS) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl DeviceReduction {
    /// Starts reducing the values of `prog` (over one input of `leaf_dtype` and `shape`) by
    /// `func` over `axes`, with accumulators for every output value.
    pub fn start(
        gpu: &'static Gpu,
        func: ReduceFunc,
        prog: &Program,
        leaf_dtype: DType,
        out_dtype: DType,
        shape: &[u64],
        axes: &[usize],
    ) -> Result<DeviceReduction> {
        let src = reduce_source(func, prog, leaf_dtype, out_dtype)
            .map_err(|why| Error::new(ErrorKind::Unsupported, why.0))?;
        let len: u64 = (0..shape.len())
            .filter(|d| !axes.contains(d))
            .map(|d| shape[d])
            .product();
        guarded("starting a reduction on the device", || {
            gpu.bind()?;
            let init = gpu.function(&src, "cf_reduce_init")?;
            let values = || DeviceArray::alloc(gpu, &[len], DType::F64);
            let r = DeviceReduction {
                gpu,
                stream: gpu.new_stream()?,
                partial: gpu.function(&src, "cf_reduce_partial")?,
                merge: gpu.function(&src, "cf_reduce_merge")?,
                finish: gpu.function(&src, "cf_reduce_finish")?,
                func,
                state: [values()?, values()?, values()?],
                part: None,
                len,
                shape: shape.to_vec(),
                axes: axes.to_vec(),
            };
            let [acc, cnt, aux] = r.state.each_ref().map(DeviceArray::device_ptr);
            let mut launch = r.stream.launch_builder(&init);
            launch.arg(&acc).arg(&cnt).arg(&aux).arg(&len);
            // SAFETY: `cf_reduce_init(double*, double*, double*, u64)`: the arrays hold `len`
            // values each.
            unsafe { launch.launch(config(len)) }
                .map_err(|e| cuda_error("launching cf_reduce_init", e))?;
            Ok(r)
        })
    }

    /// Partial buffers of at least `n` values each.
    fn partials(&mut self, n: u64) -> Result<[u64; 3]> {
        let big_enough = self
            .part
            .as_ref()
            .is_some_and(|[p, ..]| p.nbytes() as u64 >= n * 8);
        if !big_enough {
            // The previous fold's kernels may still read the old buffers.
            self.sync()?;
            self.part = None;
            let values = || DeviceArray::alloc(self.gpu, &[n], DType::F64);
            self.part = Some([values()?, values()?, values()?]);
        }
        match &self.part {
            Some(part) => Ok(part.each_ref().map(DeviceArray::device_ptr)),
            None => Err(Error::internal("no partial buffers")),
        }
    }

    /// Folds `slab`, the input's values over the box at `start` (its shape is the slab's),
    /// into the accumulators. The kernels run in order on the reduction's stream; `slab`
    /// must live until the next [`sync`](Self::sync).
    pub fn fold(&mut self, slab: &DeviceArray, start: &[u64]) -> Result<()> {
        let fold = Fold::new(&self.shape, &self.axes, start, slab.shape())
            .map_err(|why| Error::new(ErrorKind::Unsupported, why))?;
        if fold.kept == 0 || fold.reduced == 0 {
            return Ok(());
        }
        guarded("folding a slab on the device", || {
            self.gpu.bind()?;
            let [part, pcnt, paux] = self.partials(fold.kept * fold.parts)?;
            let input = slab.device_ptr();
            let [acc, cnt, aux] = self.state.each_ref().map(DeviceArray::device_ptr);
            let mut launch = self.stream.launch_builder(&self.partial);
            launch
                .arg(&input)
                .arg(&part)
                .arg(&pcnt)
                .arg(&paux)
                .arg(&fold.dims)
                .arg(&fold.kept)
                .arg(&fold.reduced)
                .arg(&fold.parts)
                .arg(&fold.ibase);
            // SAFETY: `cf_reduce_partial(l0, part, pcnt, paux, dims, K, R, P, ibase)`: the
            // slab holds the values `dims` indexes; the partial buffers hold `K * P` values
            // each.
            unsafe { launch.launch(config(fold.kept * fold.parts)) }
                .map_err(|e| cuda_error("launching cf_reduce_partial", e))?;
            let mut launch = self.stream.launch_builder(&self.merge);
            launch
                .arg(&part)
                .arg(&pcnt)
                .arg(&paux)
                .arg(&acc)
                .arg(&cnt)
                .arg(&aux)
                .arg(&fold.dims)
                .arg(&fold.kept)
                .arg(&fold.parts)
                .arg(&fold.obase);
            // SAFETY: `cf_reduce_merge(part, pcnt, paux, acc, cnt, aux, dims, K, P, obase)`:
            // every output index `obase` plus the kept offsets reach lies inside the states.
            unsafe { launch.launch(config(fold.kept)) }
                .map(|_| ())
                .map_err(|e| cuda_error("launching cf_reduce_merge", e))
        })
    }

    /// Waits for the folds launched so far.
    pub fn sync(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| cuda_error("waiting for a reduction on the device", e))
    }

    /// The finished values (`count` elements reduced into each, for means; `ddof` delta
    /// degrees of freedom, for variances), copied to the host as `out_dtype`. A NaN-skipping
    /// arg-reduction with a lane of NaN values only is an error, as on the CPU.
    pub fn finish(self, out_dtype: DType, count: u64, ddof: f64) -> Result<Buffer> {
        let values = guarded("finishing a reduction on the device", || {
            self.gpu.bind()?;
            let out = DeviceArray::alloc(self.gpu, &[self.len], out_dtype)?;
            let [acc, cnt, aux] = self.state.each_ref().map(DeviceArray::device_ptr);
            let dst = out.device_ptr();
            let (len, count) = (self.len, count as f64);
            let mut launch = self.stream.launch_builder(&self.finish);
            launch
                .arg(&acc)
                .arg(&cnt)
                .arg(&aux)
                .arg(&dst)
                .arg(&len)
                .arg(&count)
                .arg(&ddof);
            // SAFETY: `cf_reduce_finish(acc, cnt, aux, out, n, count, ddof)`: all four hold
            // `len` values.
            unsafe { launch.launch(config(len)) }
                .map_err(|e| cuda_error("launching cf_reduce_finish", e))?;
            self.sync()?;
            let mut values = Buffer::for_overwrite(out_dtype, self.len as usize);
            out.copy_to_host(values.bytes_mut())?;
            Ok(values)
        })?;
        unseen_lanes(self.func, &values)?;
        Ok(values)
    }
}

/// The CPU's error for a NaN-skipping arg-reduction whose finished `values` hold a lane that
/// saw no value (finished as -1).
fn unseen_lanes(func: ReduceFunc, values: &Buffer) -> Result<()> {
    if !matches!(func, ReduceFunc::NanArgmin | ReduceFunc::NanArgmax) {
        return Ok(());
    }
    if values.as_slice::<i64>()?.iter().any(|&i| i < 0) {
        return Err(Error::new(
            ErrorKind::Value,
            format!("{}: all-NaN slice encountered", func.name()),
        ));
    }
    Ok(())
}
