//! A device read's batches in flight: the read's stagings are used in turn, so while the
//! device copies, decodes and places one batch on one staging's stream, the CPU packs the
//! next into another's page-locked buffer and launches it on that stream (nvCOMP's calls on
//! the two streams overlap too). A staging is packed again only once its last batch is done.

use std::collections::VecDeque;

use super::batch::{BatchChunk, BatchTimes, InFlight};
use super::device_array::DeviceArray;
use super::read_staging::ReadStaging;
use super::runtime::Gpu;
use crate::error::{Error, Result};

/// The batches of one device read in flight on its stagings.
pub struct BatchQueue<'a> {
    gpu: &'a Gpu,
    slots: &'a mut [ReadStaging],
    inflight: VecDeque<(usize, InFlight)>,
    launched: usize,
    times: BatchTimes,
}

impl BatchQueue<'_> {
    /// Waits for the oldest batch in flight and adds its times.
    fn finish_oldest(&mut self) -> Result<()> {
        if let Some((_, batch)) = self.inflight.pop_front() {
            let t = batch.finish()?;
            self.times.upload += t.upload;
            self.times.decode += t.decode;
            self.times.place += t.place;
        }
        Ok(())
    }

    /// Launches the decode of `chunks` into `out` (see [`Gpu::launch_batch`]) on the next
    /// staging, once that staging's previous batch is done (a chunk it could not decode is
    /// the error then).
    pub fn push(
        &mut self,
        chunks: &[BatchChunk<'_>],
        out: &DeviceArray,
        window: &[u64],
    ) -> Result<()> {
        let slot = self.launched % self.slots.len().max(1);
        while self.inflight.iter().any(|(s, _)| *s == slot) {
            self.finish_oldest()?;
        }
        let st = self
            .slots
            .get_mut(slot)
            .ok_or_else(|| Error::internal("no device read staging"))?;
        if let Some(batch) = self.gpu.launch_batch(st, chunks, out, window)? {
            self.inflight.push_back((slot, batch));
            self.launched += 1;
        }
        Ok(())
    }

    /// Waits for every batch in flight.
    fn drain(&mut self) -> Result<()> {
        let mut first: Option<Error> = None;
        while !self.inflight.is_empty() {
            if let Err(e) = self.finish_oldest() {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl Gpu {
    /// Runs `f` with a queue of batches over the device read stagings (made on first use;
    /// reads wait here for each other), then waits for every batch it launched; returns what
    /// `f` gave and the device time of its batches by phase (summed over batches, which
    /// overlap).
    pub fn reading<T>(
        &self,
        f: impl FnOnce(&mut BatchQueue<'_>) -> Result<T>,
    ) -> Result<(T, BatchTimes)> {
        self.with_read_staging(|slots| {
            let mut queue = BatchQueue {
                gpu: self,
                slots,
                inflight: VecDeque::new(),
                launched: 0,
                times: BatchTimes::default(),
            };
            let got = f(&mut queue);
            // Nothing stays in flight on the stagings, whatever happened.
            let drained = queue.drain();
            let got = got?;
            drained?;
            Ok((got, queue.times))
        })
    }
}
