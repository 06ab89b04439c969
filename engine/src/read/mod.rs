//! Direct reads into caller memory: a region of an array, or many same-shaped windows at
//! once (the ML-training access pattern), from any store the engine opens.
//!
//! Every chunk a request touches is read once and decoded once, however many windows it
//! feeds. Reads go out in batches on the store's IO threads while earlier batches decode on
//! the compute pool; the encoded bytes waiting for decode are bounded. A chunk that fills a
//! contiguous part of the destination (whole rows of a full read) decodes straight into it.
//! A [`ChunkCache`] keeps decoded chunks across reads, within a byte budget, so windows of
//! later reads that share them do not decode them again.

mod cache;
mod cf;
mod decode;
mod destination;
#[cfg(feature = "cuda")]
mod device;
mod missing;
mod plan;
mod windows;

use crate::error::Result;
use crate::store::open_store;
use crate::zarr::ZarrArray;

pub use cache::{CacheStats, ChunkCache};
pub use cf::{decode_cf, CfDecoding};
pub(crate) use destination::Destination;
#[cfg(feature = "cuda")]
pub use device::{read_windows_to_device, DeviceReadStats};
pub use missing::missing_counts;
pub use windows::{read_region, read_windows, read_windows_cached};

/// Opens the array at `url` for reading.
pub fn open_array(url: &str, io_threads: usize) -> Result<ZarrArray> {
    ZarrArray::open(open_store(url, io_threads.max(1))?)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::plan::{shard_items, Pieces};
    use super::*;
    use crate::array::DType;
    use crate::array::Region;
    use crate::store::fs::FsStore;
    use crate::store::Store;
    use crate::zarr::{ArraySpec, Codec};

    fn sample_array(dir: &std::path::Path, codec_default: bool) -> (ZarrArray, Vec<f32>) {
        let codec = if codec_default {
            Codec::default()
        } else {
            Codec::None
        };
        let values: Vec<f32> = (0..7 * 10 * 9).map(|i| i as f32 * 0.5 - 3.0).collect();
        (sample_array_with(dir, codec, None, &values), values)
    }

    /// A 7 x 10 x 9 float32 array of 3 x 4 x 4 chunks (edge chunks padded) with `codec` and
    /// `shards`, holding `values`.
    pub(super) fn sample_array_with(
        dir: &std::path::Path,
        codec: Codec,
        shards: Option<Vec<u64>>,
        values: &[f32],
    ) -> ZarrArray {
        let store: Arc<dyn Store> = Arc::new(FsStore::new(dir, 2).unwrap());
        let spec = ArraySpec {
            shape: vec![7, 10, 9],
            dtype: DType::F32,
            chunks: vec![3, 4, 4],
            shards,
            codec,
            zarr_format: 3,
            fill: None,
            overwrite: true,
            existing: false,
            region: None,
        };
        let arr = ZarrArray::create(store, &spec).unwrap();
        store_values(&arr, values);
        arr
    }

    /// Stores `values` (the whole array, C order) in `arr`, chunk by chunk (or shard by shard).
    pub(super) fn store_values(arr: &ZarrArray, values: &[f32]) {
        let whole = Region::whole(&arr.shape());
        for idx in arr.grid().chunk_indices() {
            let region = arr.grid().chunk_region(&idx);
            let mut buf = crate::array::Buffer::zeros(DType::F32, region.len() as usize);
            crate::array::buffer::copy_region(
                bytemuck::cast_slice(values),
                &whole,
                buf.bytes_mut(),
                &region,
                &region,
                4,
            );
            if let Some(bytes) = arr.encode_chunk(&idx, &buf).unwrap() {
                arr.store().set(&arr.chunk_key(&idx), bytes).unwrap();
            }
        }
    }

    fn expected(values: &[f32], start: &[u64], size: &[u64]) -> Vec<f32> {
        let mut out = Vec::new();
        for i in 0..size[0] {
            for j in 0..size[1] {
                for k in 0..size[2] {
                    let (a, b, c) = (start[0] + i, start[1] + j, start[2] + k);
                    out.push(values[(a * 90 + b * 9 + c) as usize]);
                }
            }
        }
        out
    }

    #[test]
    fn windows_and_regions_match_the_values_written() {
        for codec_default in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let (arr, values) = sample_array(dir.path(), codec_default);
            let whole = Region::whole(&arr.shape());
            let mut out = vec![0u8; 7 * 10 * 9 * 4];
            read_region(&arr, &whole, &mut out, 2).unwrap();
            assert_eq!(bytemuck::cast_slice::<u8, f32>(&out), &values[..]);
            let starts = vec![vec![0, 0, 0], vec![2, 5, 3], vec![4, 6, 5], vec![2, 5, 3]];
            let size = [3u64, 4, 4];
            let mut out = vec![0u8; starts.len() * 48 * 4];
            read_windows(&arr, &starts, &size, &mut out, 2).unwrap();
            let got: &[f32] = bytemuck::cast_slice(&out);
            for (w, s) in starts.iter().enumerate() {
                assert_eq!(&got[w * 48..(w + 1) * 48], &expected(&values, s, &size)[..]);
            }
        }
    }

    #[test]
    fn the_cache_serves_later_reads_and_stays_within_its_budget() {
        let dir = tempfile::tempdir().unwrap();
        let (arr, values) = sample_array(dir.path(), true);
        // Chunks of 3 x 4 x 4 f32 (192 bytes, pooled at their exact size): a budget of
        // three chunks.
        let cache = ChunkCache::new(3 * 192);
        let size = [2u64, 3, 3];
        let read = |starts: &[Vec<u64>]| {
            let mut out = vec![0u8; starts.len() * 18 * 4];
            read_windows_cached(&arr, starts, &size, &mut out, 2, Some(&cache)).unwrap();
            let got: Vec<f32> = bytemuck::cast_slice(&out).to_vec();
            for (w, s) in starts.iter().enumerate() {
                assert_eq!(&got[w * 18..(w + 1) * 18], &expected(&values, s, &size)[..]);
            }
        };
        // Windows inside chunk (0, 0, 0), the first reaching its last element: a miss (the
        // whole chunk decoded), then a hit.
        read(&[vec![1, 1, 1]]);
        assert_eq!((cache.stats().hits, cache.stats().misses), (0, 1));
        read(&[vec![0, 0, 0]]);
        assert_eq!((cache.stats().hits, cache.stats().misses), (1, 1));
        // A window over eight chunks (chunk (0, 0, 0), held whole, among them): more than
        // the budget holds, so the oldest go.
        read(&[vec![2, 2, 2]]);
        let stats = cache.stats();
        assert!(
            stats.bytes <= 3 * 192 && (stats.hits, stats.misses) == (2, 8),
            "{stats:?}"
        );
        // Every read is still right after evictions, and clear empties the cache.
        read(&[vec![0, 0, 0], vec![5, 7, 6], vec![2, 2, 2]]);
        cache.clear();
        assert_eq!(cache.stats(), CacheStats::default());
        // A chunk decoded only through a window's end is no hit for a window reaching
        // further into it.
        let cache2 = ChunkCache::new(1 << 20);
        let mut out = vec![0u8; 18 * 4];
        read_windows_cached(&arr, &[vec![0, 0, 0]], &size, &mut out, 1, Some(&cache2)).unwrap();
        let mut out = vec![0u8; 18 * 4];
        read_windows_cached(&arr, &[vec![1, 1, 1]], &size, &mut out, 1, Some(&cache2)).unwrap();
        assert_eq!((cache2.stats().hits, cache2.stats().misses), (0, 2));
        assert_eq!(
            bytemuck::cast_slice::<u8, f32>(&out),
            &expected(&values, &[1, 1, 1], &size)[..]
        );
        // A chunk read again past the prefix the cache holds is decoded whole that time: a
        // window reaching further still is then a hit.
        let cache3 = ChunkCache::new(1 << 20);
        for (start, hits) in [([0u64, 0, 0], 0), ([0, 1, 0], 0), ([1, 1, 1], 1)] {
            let mut out = vec![0u8; 18 * 4];
            read_windows_cached(&arr, &[start.to_vec()], &size, &mut out, 1, Some(&cache3))
                .unwrap();
            assert_eq!(cache3.stats().hits, hits);
            assert_eq!(
                bytemuck::cast_slice::<u8, f32>(&out),
                &expected(&values, &start, &size)[..]
            );
        }
    }

    #[test]
    fn sharded_reads_use_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(FsStore::new(dir.path(), 2).unwrap());
        let spec = ArraySpec {
            shape: vec![8, 8],
            dtype: DType::F32,
            chunks: vec![2, 2],
            shards: Some(vec![4, 4]),
            codec: Codec::default(),
            zarr_format: 3,
            fill: None,
            overwrite: true,
            existing: false,
            region: None,
        };
        let arr = ZarrArray::create(store, &spec).unwrap();
        let values: Vec<f32> = (0..64).map(|i| i as f32).collect();
        for idx in arr.grid().chunk_indices() {
            let r = arr.grid().chunk_region(&idx);
            let mut buf = crate::array::Buffer::zeros(DType::F32, r.len() as usize);
            let (r0, c0, values) = (r.start[0], r.start[1], &values);
            let shard: Vec<f32> = (0..r.shape[0])
                .flat_map(|a| {
                    (0..r.shape[1]).map(move |b| values[((r0 + a) * 8 + c0 + b) as usize])
                })
                .collect();
            buf.bytes_mut()
                .copy_from_slice(bytemuck::cast_slice(&shard));
            let bytes = arr.encode_chunk(&idx, &buf).unwrap().unwrap();
            arr.store().set(&arr.chunk_key(&idx), bytes).unwrap();
        }
        let cache = ChunkCache::new(1 << 20);
        for _ in 0..2 {
            let mut out = vec![0u8; 3 * 3 * 4];
            read_windows_cached(&arr, &[vec![1, 3]], &[3, 3], &mut out, 1, Some(&cache)).unwrap();
            let want: Vec<f32> = (1..4)
                .flat_map(|r| (3..6).map(move |c| (r * 8 + c) as f32))
                .collect();
            assert_eq!(bytemuck::cast_slice::<u8, f32>(&out), &want[..]);
        }
        // Four inner chunks under the window: decoded once, then found.
        assert_eq!((cache.stats().misses, cache.stats().hits), (4, 4));
    }

    #[test]
    fn windows_outside_the_array_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (arr, _) = sample_array(dir.path(), true);
        let mut out = vec![0u8; 2 * 2 * 2 * 4];
        let err = read_windows(&arr, &[vec![6, 9, 8]], &[2, 2, 2], &mut out, 1).unwrap_err();
        assert!(err.to_string().contains("window 0"), "{err}");
        assert!(
            err.to_string()
                .contains("2 elements from 6 go past the array's extent 7"),
            "{err}"
        );
        let err = read_windows(&arr, &[vec![0, 0]], &[2, 2, 2], &mut out, 1).unwrap_err();
        assert!(err.to_string().contains("3 axes"), "{err}");
    }

    #[test]
    fn neighbouring_inner_chunks_are_read_together() {
        use crate::store::ByteRange;
        const MIB: u64 = 1 << 20;
        let at = |offset: u64, len: u64| Some(ByteRange::new(offset, Some(len)));
        // Positions 0..6 of a shard: 0 and 1 adjoin, 2 follows after a small gap, 3 would make
        // the run longer than COALESCE_MAX, 4 lies far after 3, 5 is not stored, and 6
        // lies before 0 in the file.
        let ranges = vec![
            at(MIB, 3 * MIB),
            at(4 * MIB, 2 * MIB),
            at(6 * MIB + 1000, MIB),
            at(7 * MIB + 1000, 3 * MIB),
            at(20 * MIB, 100),
            None,
            at(0, MIB),
        ];
        let touched = (0..7).map(|p| (p, vec![p as u64], Pieces::new())).collect();
        let items = shard_items("c/0", Some(&ranges), touched);
        type Read = Option<(u64, u64)>;
        type Decoded = Vec<(u64, Option<std::ops::Range<usize>>)>;
        let summary: Vec<(Read, Decoded)> = items
            .iter()
            .map(|item| {
                let read = item.req.as_ref().map(|r| {
                    let range = r.range.unwrap();
                    (range.offset, range.len.unwrap())
                });
                let units = item
                    .units
                    .iter()
                    .map(|u| (u.idx[0], u.inner.clone().unwrap()))
                    .collect();
                (read, units)
            })
            .collect();
        let m = MIB as usize;
        assert_eq!(
            summary,
            vec![
                (
                    Some((0, 6 * MIB + 1000 + MIB)),
                    vec![
                        (6, Some(0..m)),
                        (0, Some(m..4 * m)),
                        (1, Some(4 * m..6 * m)),
                        (2, Some(6 * m + 1000..7 * m + 1000)),
                    ]
                ),
                (Some((7 * MIB + 1000, 3 * MIB)), vec![(3, Some(0..3 * m))]),
                (Some((20 * MIB, 100)), vec![(4, Some(0..100))]),
                (None, vec![(5, None)]),
            ]
        );
        assert!(items
            .iter()
            .all(|i| i.req.as_ref().is_none_or(|r| r.key == "c/0")));
        // A shard not stored: every inner chunk is the fill value, nothing is read.
        let touched = (0..3).map(|p| (p, vec![p as u64], Pieces::new())).collect();
        let items = shard_items("c/1", None, touched);
        assert_eq!(items.len(), 1);
        assert!(items[0].req.is_none() && items[0].units.len() == 3);
    }
}
